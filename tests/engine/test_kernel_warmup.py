"""Start-up compiles every kernel variant the engine can launch, so serving compiles none.

On CPU nothing compiles, so the property is checked through launch keys (what makes two
launches need two compiled variants): an engine on the Triton kernels (Triton's
interpreter) runs a mix of prefills, decodes, chunked prefills, prefix-cache hits and
adapters of different ranks and targets, and every launch it makes has a key the
warm-up's list for its configuration holds. On a GPU bench/gpu_suite_compile.py counts
Triton's compilations after warm-up instead."""

import dataclasses
import importlib.util
import os

import pytest
import torch

from inference.engine import EngineRequest, LLMEngine, SamplingParams
from inference.engine.config import EngineConfig
from inference.engine.cuda_graphs import direct_capture
from inference.engine.kernel_warmup import compile_kernels, engine_shapes, listed_variants
from tests.engine.lora_fixtures import ALL_LINEAR, ATTENTION, request_for, run_all
from tests.fresh_python import run_python
from tests.tiny_models import make_tiny_model

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="triton not installed"
)

SETTINGS = dict(
    enable_lora=True,
    attention_backend="triton",
    block_size=4,
    kv_cache_bytes=4 << 20,
    max_loras=2,
    max_lora_rank=8,
    max_num_seqs=4,
    max_num_batched_tokens=12,  # long prompts prefill in chunks beside running decodes
)


@pytest.fixture
def triton_lora(monkeypatch):
    monkeypatch.setenv("LORAPLEX_LORA_BACKEND", "triton")


@pytest.mark.parametrize("graphs", [False, True])
def test_serving_launches_only_variants_the_warm_up_lists(
    lora_model_dir, adapters, triton_lora, graphs
):
    """With `graphs`, decode batches replay the decode graphs' steps (captured directly: no
    CUDA graph on CPU, the same static buffers and launches)."""
    from inference.kernels.compilation import recorded_launches

    engine = LLMEngine(model=lora_model_dir, **SETTINGS)
    assert engine.model_runner.paged and engine.model_runner.lora_slots.backend == "triton"
    listed = listed_variants(engine.config)
    loras = [
        request_for("r8", adapters("r8", rank=8, targets=ALL_LINEAR)),
        request_for("r4", adapters("r4", rank=4, targets=ATTENTION)),
        None,
    ]
    shared = [7, 11, 13, 17, 19, 23, 29, 31, 37]  # more than two blocks: later prompts hit them
    rounds = [
        [(shared + [41], 0, 3), ([5, 6], 2, 4)],  # one prefill chunked, beside a short one
        [(shared + [43, 47], 0, 2), ([9] * 15, 1, 3), ([3], 2, 2), (shared, 1, 2)],
        [([8, 9, 10], 0, 1)],  # a lone decode-sized batch
    ]
    with recorded_launches(execute=True) as launched:
        if graphs:
            engine.model_runner.enable_graphs(direct_capture)
        for i, requests in enumerate(rounds):
            for j, (prompt, lora, tokens) in enumerate(requests):
                engine.add_request(EngineRequest(
                    f"q{i}-{j}",
                    prompt_token_ids=prompt,
                    sampling_params=SamplingParams(temperature=0, max_tokens=tokens,
                                                   ignore_eos=True),
                    lora_request=loras[lora],
                ))  # fmt: skip
            results = run_all(engine)
            assert all(r["error"] is None for r in results.values())
    assert engine.block_manager.stats.hits > 0
    assert (engine.model_runner.graphs is not None) == graphs
    met = set(launched)
    assert {k.kernel for k in met} >= {"paged_extend_kernel", "paged_decode_kernel",
                                       "sgmv_shrink_kernel", "bgmv_expand_kernel"}  # fmt: skip
    unlisted = sorted(k.describe() + str(k.args) for k in met - listed)
    assert not unlisted, "launched but never compiled at start-up:\n" + "\n".join(unlisted)


def test_the_listed_variants_are_finite_and_follow_the_configuration(lora_model_dir, triton_lora):
    config = EngineConfig(model=lora_model_dir, **SETTINGS)
    listed = listed_variants(config)
    assert 0 < len(listed) < 200
    assert listed_variants(config) == listed  # the same list every time
    # a shorter context adds no variant (table widths and split counts are run-time
    # values); it only never splits a decode
    shorter = EngineConfig(model=lora_model_dir, **SETTINGS | {"max_model_len": 64})
    assert engine_shapes(shorter).max_blocks < engine_shapes(config).max_blocks
    assert listed_variants(shorter) < listed
    kernels = {k.kernel for k in listed}
    assert "sgmv_expand_kernel" in kernels and "paged_decode_kernel" in kernels


def test_without_triton_kernels_nothing_is_listed_or_compiled(lora_model_dir, monkeypatch):
    monkeypatch.setenv("LORAPLEX_LORA_BACKEND", "torch")
    config = EngineConfig(model=lora_model_dir, **SETTINGS | {"attention_backend": "torch"})
    assert listed_variants(config) == set()
    assert compile_kernels(config, torch.device("cpu")) is None


def test_lora_variants_are_listed_only_for_the_triton_lora_backend(lora_model_dir, monkeypatch):
    monkeypatch.setenv("LORAPLEX_LORA_BACKEND", "torch")
    config = EngineConfig(model=lora_model_dir, **SETTINGS)
    assert engine_shapes(config).lora_rank == 0
    assert {k.kernel for k in listed_variants(config)} <= {
        "paged_decode_kernel", "paged_decode_reduce_kernel", "paged_extend_kernel"
    }  # fmt: skip


COMPILE_SCRIPT = r"""
import sys
from pathlib import Path

import torch

from inference.engine.kernel_warmup import compile_listed
from inference.kernels.compilation import EngineShapes
from inference.kernels.compilation.target import compile_target
from inference.kernels.lora_tiles import DEFAULT_TABLE

shapes = EngineShapes(name="tiny", dtype=torch.bfloat16, hidden=64, intermediate=128,
                      num_heads=4, num_kv_heads=2, head_dim=16, windows=(None,), softcap=None,
                      max_model_len=512, max_num_seqs=4, max_num_batched_tokens=16,
                      graph_sizes=(1, 2, 4), lora_rank=8, max_loras=2)
with compile_target(90):
    warmup = compile_listed(shapes, DEFAULT_TABLE, 90, jobs=2)
assert not warmup.failures, warmup.failures
entries = list(Path(sys.argv[1]).glob("*/__grp__*.json"))
print(warmup.variants, len(entries))
"""


def test_variants_compiled_in_processes_load_from_the_cache_here(tmp_path):
    """Two processes compile the variants into Triton's disk cache, and this process's own
    pass finds each there: it adds no entry of its own (a second key per variant would)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env |= {"TRITON_CACHE_DIR": str(tmp_path / "cache")}
    result = run_python(COMPILE_SCRIPT, str(tmp_path / "cache"), env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    variants, entries = map(int, result.stdout.split()[-2:])
    assert variants > 10 and entries == variants


@pytest.mark.parametrize("family", ["mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3"])
def test_every_family_launches_only_listed_attention_variants(tmp_path, family):
    """Sliding windows (uniform and per layer), soft-capping, per-head q/k norms, fused
    projections: each launches paged attention with its own query views and options."""
    from inference.kernels.compilation import recorded_launches

    folder = make_tiny_model(tmp_path, family)
    engine = LLMEngine(model=folder, attention_backend="triton", block_size=4,
                       kv_cache_bytes=1 << 20, max_num_seqs=4,
                       max_num_batched_tokens=12)  # fmt: skip
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    prompts = [list(range(5, 25)), [7, 8], list(range(5, 25)) + [3], [9] * 6]
    with recorded_launches(execute=True) as launched:
        for i, prompt in enumerate(prompts):
            engine.add_request(EngineRequest(f"f{i}", prompt_token_ids=prompt,
                                             sampling_params=params))  # fmt: skip
        run_all(engine)
    met = set(launched)
    assert {k.kernel for k in met} >= {"paged_extend_kernel", "paged_decode_kernel"}
    assert not met - listed_variants(engine.config), family


def test_a_deterministic_engine_lists_its_unsplit_shrinks(lora_model_dir, triton_lora):
    """deterministic_kernels turns split-K off, which changes the shrinks' variants; at
    Llama-3-8B's sizes the default table splits K for small batches."""
    from inference.kernels.compilation.compile import listed_keys
    from inference.kernels.lora_tiles import DEFAULT_TABLE

    config = EngineConfig(model=lora_model_dir, **SETTINGS | {"deterministic_kernels": True})
    assert engine_shapes(config).deterministic
    llama_8b = dataclasses.replace(engine_shapes(config), hidden=4096, intermediate=14336,
                                   num_heads=32, num_kv_heads=8, head_dim=128,
                                   dtype=torch.bfloat16)  # fmt: skip

    def splits(shapes):
        keys = listed_keys([shapes], DEFAULT_TABLE)
        return {dict(k.constexprs)["SPLIT_K"] for k in keys if "shrink" in k.kernel}

    assert splits(llama_8b) == {1}
    assert max(splits(dataclasses.replace(llama_8b, deterministic=False))) > 1


@pytest.mark.parametrize("slots", [[0], [1, -1, 0], [2, 2, 0, -1, 1], [-1] * 3 + [0] * 4])
def test_every_lora_batch_field_starts_16_byte_aligned(slots):
    """Triton specialises a pointer on its alignment; the batch's fields share one upload,
    so odd field lengths must not shift the next field off the alignment warm-up compiled."""
    from inference.kernels.lora_batch import make_lora_batch

    batch = make_lora_batch(torch.tensor(slots), backend="torch")
    fields = [batch.token_slots, batch.sorted_token_ids, batch.seg_starts, batch.seg_lens,
              batch.seg_slots, batch.padded_rows]  # fmt: skip
    assert all(f.data_ptr() % 16 == 0 for f in fields)
    assert batch.token_slots.tolist() == slots
    assert batch.seg_lens.sum().item() == sum(s >= 0 for s in slots)
