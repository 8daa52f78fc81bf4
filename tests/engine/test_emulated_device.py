"""The engine on an emulated GPU: the real scheduler and host side, each step the cost
model's time for its batch, the pool sized as the planner sizes that deployment."""

import time

import pytest

from inference.engine import EngineRequest, LLMEngine, LoRARequest, SamplingParams
from inference.engine.emulation.lora import emulated_adapter_bytes
from inference.engine.emulation.runner import step_shape
from inference.engine.errors import ConfigError
from inference.engine.planning import PlanRequest, device_named, plan
from inference.engine.planning.presets import PRESETS
from inference.engine.planning.step_time import StepTimeModel
from tests.peft_adapters import make_peft_adapter
from tests.tiny_llama import make_tiny_llama

EMULATED = {"emulate_device": "h100", "emulate_model": "llama-3-8b", "max_model_len": 512}


@pytest.fixture(scope="module")
def served_dir(tmp_path_factory):
    """The served model: its tokenizer and vocabulary only (no weight of it is loaded)."""
    return make_tiny_llama(tmp_path_factory.mktemp("emulated"), num_layers=2)


def _engine(served_dir, **settings) -> LLMEngine:
    return LLMEngine(model=served_dir, **{**EMULATED, **settings})


def _run(engine: LLMEngine, prompts: list[list[int]], max_tokens: int = 12) -> dict[str, list]:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(EngineRequest(str(i), prompt_token_ids=prompt, sampling_params=params))
    tokens: dict[str, list] = {str(i): [] for i in range(len(prompts))}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
    return tokens


PROMPTS = [[5 + i % 40] * n for i, n in enumerate((3, 40, 17, 90, 8))]


def test_each_step_takes_the_cost_models_time_for_its_batch(served_dir):
    engine = _engine(served_dir)
    runner = engine.model_runner
    shapes = []
    schedule = engine.scheduler.schedule

    def recording():  # the batch as the runner receives it, before its tokens count
        batch = schedule()
        if batch:
            shapes.append(step_shape(batch))
        return batch

    engine.scheduler.schedule = recording
    start = time.perf_counter()
    tokens = _run(engine, PROMPTS)
    elapsed = time.perf_counter() - start
    assert all(len(t) == 12 for t in tokens.values())
    model = StepTimeModel(runner.target.model, device_named("h100"))
    expected = sum(model.step_seconds(shape) for shape in shapes)
    assert runner.device.steps == len(shapes) == engine.num_steps
    assert runner.device.busy_seconds == pytest.approx(expected, rel=1e-12)
    assert elapsed >= expected  # the engine really waited for the device
    assert any(s.prefills for s in shapes) and any(s.decode_contexts for s in shapes)
    assert engine.stats()["emulated_device"] == {"busy_seconds": expected, "steps": len(shapes)}


def test_an_emulated_engines_outputs_repeat(served_dir):
    first = _run(_engine(served_dir), PROMPTS)
    second = _run(_engine(served_dir), PROMPTS)
    assert first == second
    assert len({tuple(t) for t in first.values()}) > 1  # not one answer for every prompt


def test_the_pool_holds_what_the_planner_finds_for_that_gpu(served_dir):
    engine = _engine(served_dir, emulate_device="h200", emulate_model="llama-3-70b",
                     emulate_quantization="fp8")  # fmt: skip
    expected = plan(
        PlanRequest(
            config=PRESETS["llama-3-70b"],
            device=device_named("h200"),
            quantization="fp8",
            max_model_len=512,
            max_num_batched_tokens=engine.config.max_num_batched_tokens,
            engine_pool=True,
            suggest=False,
        )
    )
    assert engine.block_manager.num_blocks == expected.kv_blocks > 10_000
    assert engine.config.max_num_batched_tokens == 8192  # a GPU's defaults, not the CPU's
    info = engine.stats()["engine_info"]
    assert (info["device_type"], info["device_name"], info["emulated_model"]) == (
        "emulated", "h200", "llama-3-70b")  # fmt: skip


def test_the_pool_makes_as_many_slots_as_the_host_cache_holds(served_dir):
    """An idle slot costs the KV side nothing, so a GPU's pool with room for a hundred
    adapters makes a hundred slots when the host cache holds that many, as planned."""
    target = {"emulate_device": "h200", "emulate_model": "llama-3-70b",
              "emulate_quantization": "fp8", "enable_lora": True, "max_lora_rank": 16}  # fmt: skip
    engine = _engine(served_dir, **target, max_cpu_loras=100)
    expected = engine.model_runner.target.plan
    assert engine.model_runner.pool.num_slots == expected.device_slots == 100
    assert engine.stats()["lora"]["slots_total"] == 100
    assert _engine(served_dir, **target).model_runner.pool.num_slots == 32  # the host default


def test_a_config_json_names_the_emulated_model(served_dir, tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps(PRESETS["mistral-7b"]))
    engine = _engine(served_dir, emulate_model=str(tmp_path))
    assert _run(engine, PROMPTS[:2], max_tokens=3)["1"]


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"emulate_device": "h900"}, "must name a GPU the planner knows"),
        ({"emulate_device": "cpu"}, "must name a GPU"),
        ({"emulate_model": "llama-9"}, "neither a preset"),
        ({"emulate_model": None}, "needs emulate_model"),
        ({"emulate_quantization": "int3"}, "unknown quantization"),
        ({"device": "cuda"}, "runs on the cpu"),
        ({"emulate_model": "llama-3.1-405b"}, "llama-3.1-405b on h100"),  # does not fit one GPU
        ({"tensor_parallel_size": 3, "emulate_model": "llama-3-70b"}, "divide"),
    ],
)
def test_bad_emulation_settings_say_what_is_wrong(served_dir, settings, message):
    with pytest.raises(ConfigError, match=message):
        _engine(served_dir, **settings)


def test_adapters_swap_in_over_the_host_link_and_cost_their_steps(served_dir, tmp_path):
    adapters = [
        make_peft_adapter(served_dir, tmp_path / f"a{i}", rank=rank, targets=targets, seed=i)
        for i, (rank, targets) in enumerate([(8, ("q_proj", "v_proj")), (16, ("down_proj",))])
    ]
    engine = _engine(served_dir, enable_lora=True, max_loras=2)
    runner = engine.model_runner
    steps = []
    step_seconds = runner.cost.step_seconds

    def recording(shape):
        steps.append((shape, step_seconds(shape)))
        return steps[-1][1]

    runner.cost.step_seconds = recording
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    for i, prompt in enumerate(PROMPTS):
        lora = None if i == 4 else LoRARequest(f"a{i % 2}", f"id-{i % 2}", adapters[i % 2])
        engine.add_request(EngineRequest(str(i), prompt_token_ids=prompt, sampling_params=params,
                                         lora_request=lora))  # fmt: skip
    done = {}
    while engine.has_unfinished():
        for out in engine.step():
            done.setdefault(out.request_id, []).extend(out.new_token_ids)
    assert sorted(done) == ["0", "1", "2", "3", "4"] and all(len(t) == 6 for t in done.values())
    assert {shape.lora_ranks for shape, _ in steps} >= {(8, 16)}  # both adapters in a step
    swaps = runner.cost.copy_seconds(
        emulated_adapter_bytes(runner.cost, 8, ("q_proj", "v_proj"))
    ) + runner.cost.copy_seconds(emulated_adapter_bytes(runner.cost, 16, ("down_proj",)))
    all_linear = emulated_adapter_bytes(runner.cost, 16, tuple(runner.cost.linears))
    assert all_linear == 83_886_080  # Llama-3-8B, rank 16 on all seven projections, bf16
    busy = runner.device.busy_seconds
    assert busy == pytest.approx(sum(s for _, s in steps) + swaps, rel=1e-9)
    assert engine.stats()["lora"]["slots_total"] == 2
