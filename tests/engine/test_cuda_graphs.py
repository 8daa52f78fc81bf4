"""The decode graphs' bookkeeping on CPU: the same code as on CUDA with the capture replaced
by a direct call (the replay runs the step), the attention and LoRA kernels on Triton's
interpreter. Graph-path decode steps give the eager path's logits and transformers', for
batches padded to their bucket or not, with adapters mixed with base rows, with sliding
windows that release blocks; the static buffers are written in place, the padding rows
write only the block reserved for them, and sampling on the graphs draws what eager does."""

import pytest
import torch

from inference.engine import EngineRequest, LLMEngine, LoRARequest, SamplingParams
from inference.engine.block_manager import RELEASED
from inference.engine.config import EngineConfig
from inference.engine.cuda_graphs import (
    MODES,
    SAMPLE_BYTES_PER_LOGIT,
    capture_sizes,
    direct_capture,
    graph_pool_estimate,
)
from inference.engine.errors import ConfigError
from inference.engine.kv_cache import device_kv_budget
from inference.kernels.lora_batch import static_decode_batch
from tests.engine.lora_fixtures import ALL_LINEAR, run_all
from tests.engine.stepping import step_logits
from tests.engine.test_model_families import _hf, _hf_next_logits
from tests.tiny_models import make_tiny_model

KINDS = ("forward", *MODES)  # what capture_all captures per size, in order


class Recorder:
    """A direct capture that notes which captured step each replay ran."""

    def __init__(self) -> None:
        self.captured = 0
        self.replayed: list[int] = []

    def __call__(self, step):
        index = self.captured
        self.captured += 1

        def replay():
            self.replayed.append(index)
            return direct_capture(step)()

        return replay

    def kinds(self, engine: LLMEngine) -> list[tuple[int, object]]:
        """(size, kind) of each replay."""
        graphs = engine.model_runner.graphs
        assert graphs is not None
        sizes = list(reversed(graphs.sizes))
        return [(sizes[i // len(KINDS)], KINDS[i % len(KINDS)]) for i in self.replayed]


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("llama"), "llama")


def engine_for(folder, *, graphs=True, recorder=None, **kwargs) -> LLMEngine:
    kwargs.setdefault("block_size", 4)
    kwargs.setdefault("kv_cache_bytes", 1 << 20)
    kwargs.setdefault("max_num_seqs", 4)
    kwargs.setdefault("max_cudagraph_capture_size", 4)
    engine = LLMEngine(model=folder, attention_backend="triton", enforce_eager=not graphs, **kwargs)
    if graphs:
        engine.model_runner.enable_graphs(recorder or direct_capture)
    return engine


def decode_logits(engine, hf, prompts, steps, lora=None) -> dict[tuple[str, int], torch.Tensor]:
    """Each decode row's logits by (request, length), the tokens fed chosen by transformers'
    argmax (when `hf` is given, each row is checked against it) or the row's own."""
    params = SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True)
    for i, ids in enumerate(prompts):
        lora_request = lora[i] if lora else None
        engine.add_request(
            EngineRequest(f"r{i}", prompt_token_ids=ids, sampling_params=params,
                          lora_request=lora_request)
        )  # fmt: skip
    rows: dict[tuple[str, int], torch.Tensor] = {}
    while len(rows) < steps * len(prompts):
        for seq, row in step_logits(engine):
            token = int(row.argmax())
            if hf is not None:
                expected = _hf_next_logits(hf, seq.token_ids)
                torch.testing.assert_close(row, expected, atol=1e-4, rtol=0)
                token = int(expected.argmax())
            rows[(seq.request_id, len(seq))] = row
            seq.token_ids.append(token)
    return rows


def assert_same_rows(got: dict, want: dict) -> float:
    assert got.keys() == want.keys()
    worst = max(float((got[k] - want[k]).abs().max()) for k in want)
    assert worst < 1e-5, worst
    return worst


def test_capture_sizes_follow_vllm():
    assert capture_sizes(1) == [1]
    assert capture_sizes(3) == [1, 2, 3]
    assert capture_sizes(8) == [1, 2, 4, 8]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20]
    sizes = capture_sizes(256)
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-2:] == [248, 256] and len(sizes) == 35


def test_a_batch_pads_to_the_smallest_size_that_holds_it(llama_dir):
    engine = engine_for(llama_dir, max_num_seqs=12, max_cudagraph_capture_size=12)
    graphs = engine.model_runner.graphs
    assert graphs.sizes == [1, 2, 4, 8, 12]
    assert [graphs.bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 12)] == [1, 2, 4, 4, 8, 8, 12, 12]


def test_every_size_and_sampling_mode_is_captured_once(llama_dir):
    recorder = Recorder()
    engine = engine_for(llama_dir, recorder=recorder)
    assert recorder.captured == len(engine.model_runner.graphs.sizes) * len(KINDS)
    assert recorder.replayed == []


@pytest.mark.parametrize(
    "lengths", [(6,), (1, 5, 13), (1, 5, 13, 20), (3, 7)], ids=["1", "3-of-4", "4", "2"]
)
def test_graph_steps_match_eager_and_transformers(llama_dir, lengths):
    hf = _hf(llama_dir)
    torch.manual_seed(len(lengths))
    prompts = [torch.randint(3, 384, (n,)).tolist() for n in lengths]
    recorder = Recorder()
    engine = engine_for(llama_dir, recorder=recorder)
    graphs = decode_logits(engine, hf, prompts, 4)
    eager = decode_logits(engine_for(llama_dir, graphs=False), hf, prompts, 4)
    assert_same_rows(graphs, eager)
    forwards = [size for size, kind in recorder.kinds(engine) if kind == "forward"]
    bucket = 4 if len(lengths) == 3 else len(lengths)
    assert forwards == [bucket] * 3  # every decode step but the first (after the prefill)


def test_sliding_window_blocks_released_while_on_graphs(tmp_path):
    folder = make_tiny_model(tmp_path, "mistral")  # window 8, every layer slides
    hf = _hf(folder)
    recorder = Recorder()
    engine = engine_for(folder, recorder=recorder)
    torch.manual_seed(3)
    prompts = [torch.randint(3, 384, (n,)).tolist() for n in (5, 13, 20)]
    released: list[bool] = []
    original = engine.model_runner.graphs.forward

    def forward(rows):
        released.append(any(RELEASED in table for table in rows.tables))
        return original(rows)

    engine.model_runner.graphs.forward = forward
    decode_logits(engine, hf, prompts, 6)
    assert any(released) and recorder.replayed


def test_static_buffers_are_updated_in_place(llama_dir):
    engine = engine_for(llama_dir)
    runner = engine.model_runner
    buffers = runner.graphs.buffers
    tensors = [buffers.ints, buffers.tables, buffers.context_lens, buffers.logits, buffers.seeds]
    pointers = [t.data_ptr() for t in tensors]
    pad_slot = runner.num_blocks * runner.block_size
    params = SamplingParams(temperature=0.7, seed=5, max_tokens=4, ignore_eos=True)
    for i, n in enumerate((3, 6, 9)):
        engine.add_request(
            EngineRequest(f"r{i}", prompt_token_ids=list(range(3, 3 + n)), sampling_params=params)
        )
    for _ in range(4):
        engine.step()
        assert [t.data_ptr() for t in tensors] == pointers
    assert int(buffers.context_lens[2]) == 9 + 3  # the last step fed r2's third sampled token
    # the fourth row of the bucket is padding: nothing to attend to, no adapter, the pad slot
    assert int(buffers.context_lens[3]) == 0
    assert int(buffers.lora_slots[3]) == -1
    assert int(buffers.slot_mapping[3]) == pad_slot + 3 % runner.block_size
    assert int(buffers.input_ids[3]) == 0 and int(buffers.positions[3]) == 0


def test_padding_rows_never_change_a_real_block(llama_dir):
    engine = engine_for(llama_dir)
    runner = engine.model_runner
    assert engine.block_manager.num_blocks == runner.num_blocks  # the pad block is not handed out
    block_size = runner.block_size
    pad_block = runner.num_blocks
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    for i, n in enumerate((2, 7, 11)):  # 3 rows in a bucket of 4
        engine.add_request(
            EngineRequest(f"r{i}", prompt_token_ids=list(range(5, 5 + n)), sampling_params=params)
        )
    for seq, row in step_logits(engine):  # the prefill, eager
        seq.token_ids.append(int(row.argmax()))
    padded_steps = 0
    for _ in range(3):
        runner.kv_cache[pad_block] = 0  # so the padding's writes show every step
        before = runner.kv_cache.clone()
        rows = step_logits(engine)
        cache = runner.kv_cache  # block-major: [pages, 2, layers, block_size, ...]
        changed = (cache != before).flatten(4).any(-1).any(1).any(1).flatten()  # by slot
        real = {runner.input_builder.slot(seq, len(seq) - 1) for seq, _ in rows}
        pad = set(range(pad_block * block_size, (pad_block + 1) * block_size))
        written = set(changed.nonzero().flatten().tolist())
        assert written - pad <= real and real <= written
        padded_steps += bool(written & pad)
        for seq, row in rows:
            seq.token_ids.append(int(row.argmax()))
    assert padded_steps == 3


def load(engine: LLMEngine, loras: list[LoRARequest]) -> None:
    futures = [engine.load_lora(lora) for lora in loras]
    while not all(f.done() for f in futures):
        engine.step()
        engine.wait_for_load(0.05)


@pytest.fixture
def triton_lora(monkeypatch):
    """The LoRA ops on the Triton kernels (interpreted): BGMV reads slots on the device."""
    monkeypatch.setenv("LORAPLEX_LORA_BACKEND", "triton")


def test_adapters_mixed_with_base_rows_on_graphs(lora_model_dir, adapters, triton_lora):
    paths = [
        adapters("g0", rank=8, targets=ALL_LINEAR),
        adapters("g1", rank=4, targets=("q_proj", "v_proj")),
    ]
    loras = [LoRARequest(f"g{i}", f"g{i}", str(p)) for i, p in enumerate(paths)]
    prompts = [[5, 9, 17], [6, 9], [7, 9, 17, 33]]
    per_row = [loras[0], None, loras[1]]
    results = []
    for graphs in (True, False):
        recorder = Recorder()
        engine = engine_for(
            lora_model_dir, graphs=graphs, recorder=recorder, enable_lora=True, max_loras=2
        )
        assert engine.model_runner.lora_slots.backend == "triton"
        load(engine, loras)
        results.append(decode_logits(engine, None, prompts, 3, lora=per_row))
        assert bool(recorder.replayed) == graphs
    assert_same_rows(*results)
    base = decode_logits(engine_for(lora_model_dir), None, [prompts[1]], 3)
    assert_same_rows({("r1", k[1]): v for k, v in base.items()},
                     {k: v for k, v in results[0].items() if k[0] == "r1"})  # fmt: skip


def test_an_adapter_with_dora_runs_eagerly(lora_model_dir, adapters, triton_lora):
    path = adapters("g-dora", rank=4, alpha=8, targets=ALL_LINEAR, use_dora=True)
    lora = LoRARequest("gd", "gd", str(path))
    results = []
    for graphs in (True, False):
        recorder = Recorder()
        engine = engine_for(
            lora_model_dir, graphs=graphs, recorder=recorder, enable_lora=True, max_loras=2
        )
        load(engine, [lora])
        results.append(decode_logits(engine, None, [[5, 9], [6, 9, 17]], 3, lora=[lora, None]))
        assert recorder.replayed == []  # the batch holds an adapter with extras
    assert_same_rows(*results)


@pytest.mark.parametrize(
    "params, kind",
    [
        (dict(temperature=0), MODES[0]),
        (dict(temperature=0.8, seed=7), MODES[1]),
        (dict(temperature=0.9, top_p=0.8, top_k=20, seed=3), MODES[2]),
        (dict(temperature=0.8, seed=7, logprobs=2), None),  # sampled eagerly after the replay
        (dict(temperature=0.8, seed=7, repetition_penalty=1.3, min_p=0.1, min_tokens=2), None),
    ],
    ids=["greedy", "random", "cut", "logprobs", "penalties"],
)
def test_sampling_on_graphs_draws_what_eager_draws(llama_dir, params, kind):
    outputs = []
    for graphs in (True, False):
        recorder = Recorder()
        engine = engine_for(llama_dir, graphs=graphs, recorder=recorder)
        for i, n in enumerate((2, 5, 8)):
            sampling = SamplingParams(max_tokens=5, ignore_eos=True, **params)
            engine.add_request(
                EngineRequest(f"s{i}", prompt_token_ids=list(range(4, 4 + n)),
                              sampling_params=sampling)
            )  # fmt: skip
        outputs.append(run_all(engine))
        if graphs:
            kinds = {k for _, k in recorder.kinds(engine)}
            assert kinds == ({"forward", kind} if kind else {"forward"})
    assert outputs[0] == outputs[1]


def test_enforce_eager_keeps_every_step_eager(llama_dir):
    eager = LLMEngine(model=llama_dir, block_size=4, kv_cache_bytes=1 << 20,
                      attention_backend="triton", enforce_eager=True)  # fmt: skip
    allowed = LLMEngine(model=llama_dir, block_size=4, kv_cache_bytes=1 << 20,
                        attention_backend="triton")  # fmt: skip
    assert eager.model_runner.graphs is None
    assert allowed.model_runner.graphs is None  # captured on CUDA only; tests enable them
    assert eager.model_runner.num_blocks == allowed.model_runner.num_blocks + 1
    with pytest.raises(AssertionError, match="paged kernels"):
        eager.model_runner.enable_graphs(direct_capture)


def test_graph_settings_default_and_clip(llama_dir):
    config = EngineConfig(model=llama_dir, max_num_seqs=300)
    assert config.max_cudagraph_capture_size == 256 and config.enforce_eager is False
    config = EngineConfig(model=llama_dir, max_num_seqs=6, max_cudagraph_capture_size=64)
    assert config.max_cudagraph_capture_size == 6


@pytest.mark.parametrize("value", [0, -8, True, 2.5, "8"])
def test_a_bad_capture_size_is_refused(llama_dir, value):
    with pytest.raises(ConfigError, match="max_cudagraph_capture_size must be a positive"):
        EngineConfig(model=llama_dir, max_cudagraph_capture_size=value)


def test_a_bad_enforce_eager_is_refused(llama_dir):
    with pytest.raises(ConfigError, match="enforce_eager must be true or false"):
        EngineConfig(model=llama_dir, enforce_eager="yes")


def test_a_cache_of_one_block_leaves_none_beside_the_pad_block(llama_dir):
    block = EngineConfig(model=llama_dir, block_size=4).kv_block_bytes
    with pytest.raises(ConfigError, match="reserve one for padding"):
        LLMEngine(model=llama_dir, block_size=4, kv_cache_bytes=block, attention_backend="triton")
    LLMEngine(model=llama_dir, block_size=4, kv_cache_bytes=block, attention_backend="triton",
              enforce_eager=True, max_model_len=4)  # fmt: skip


@pytest.mark.parametrize(
    "slots, message",
    [
        (torch.zeros(4, dtype=torch.int32), "contiguous int64"),
        (torch.zeros(2, 2, dtype=torch.long), "1-D"),
        (torch.zeros(8, dtype=torch.long)[::2], "contiguous int64"),
    ],
)
def test_a_static_lora_batch_refuses_bad_slot_buffers(slots, message):
    with pytest.raises(ValueError, match=message):
        static_decode_batch(slots)


def test_a_graph_decode_step_uploads_its_inputs_once(llama_dir):
    engine = engine_for(llama_dir)
    runner = engine.model_runner
    eager, graphs = runner.input_builder.staging, runner.graphs.staging
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    for i, n in enumerate((3, 6, 9)):
        engine.add_request(
            EngineRequest(f"r{i}", prompt_token_ids=list(range(3, 3 + n)), sampling_params=params)
        )
    engine.step()  # the prefill, eager
    assert (eager.uploads, graphs.uploads) == (1, 0)
    for step in range(1, 4):
        engine.step()
        assert (eager.uploads, graphs.uploads) == (1, step)


def test_the_graph_pool_estimate_counts_the_buffers_exactly(llama_dir):
    engine = engine_for(llama_dir, max_num_seqs=12, max_cudagraph_capture_size=12)
    runner = engine.model_runner
    estimate = runner.graph_estimate
    assert estimate.buffers == runner.graphs.buffers.nbytes == runner.graph_bytes
    mc = runner.config.model_config
    assert estimate.activations >= 12 * SAMPLE_BYTES_PER_LOGIT * mc.vocab_size
    assert estimate.total > estimate.buffers + estimate.activations
    max_blocks = runner.graphs.buffers.tables.shape[1]
    twice = graph_pool_estimate(mc, runner.config.torch_dtype, 24, max_blocks)
    assert twice.activations == 2 * estimate.activations  # per row of the largest bucket


def test_the_kv_budget_keeps_room_for_the_graph_pool(llama_dir):
    config = EngineConfig(model=llama_dir, gpu_memory_utilization=0.9)
    used, activations = 20 << 30, 1 << 30
    budget = device_kv_budget(config, 80 << 30, used, activations, graph_bytes=0)
    assert device_kv_budget(config, 80 << 30, used, activations, 3 << 30) == budget - (3 << 30)
    with pytest.raises(ConfigError, match="GiB kept for CUDA graphs.*max_cudagraph_capture_size"):
        device_kv_budget(config, 80 << 30, used, activations, budget)
