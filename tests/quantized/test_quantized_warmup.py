"""A quantized base's GEMMs are among the variants start-up compiles, as it launches them.

On CPU nothing compiles, so this is checked through launch keys (kernels/compilation/
launches.py), as tests/engine/test_kernel_warmup.py does for attention and LoRA: an
engine over a quantized checkpoint, its kernels on Triton (the interpreter), runs a mix of
prefills, chunked prefills and decodes, and every launch it makes has a key in the list
warm-up compiles for its configuration. The list is made from the configuration alone
(the scheme's name in config.json), the launches from the layers as loaded (merged
projections, AWQ and GPTQ repacked, FP8 scales per row), so the two are checked against
each other here.
"""

from __future__ import annotations

import importlib.util

import pytest

from inference.engine import EngineRequest, LLMEngine, SamplingParams
from inference.engine.kernel_warmup import engine_shapes, launches_kernels, listed_variants
from inference.kernels.compilation.variants import check_quant_schemes
from tests.engine.lora_fixtures import request_for, run_all

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="triton not installed"
)

SETTINGS = dict(
    attention_backend="triton",
    block_size=4,
    kv_cache_bytes=4 << 20,
    max_num_seqs=4,
    max_num_batched_tokens=12,  # long prompts prefill in chunks beside running decodes
)
QUANT_KERNELS = {
    "int_weight_gemm_kernel",
    "fp8_quantize_rows_kernel",
    "fp8_gemm_kernel",
    "fp8_weight_only_gemm_kernel",
}
COMPRESSED = {
    "llama-w4a16": "w4a16-g128",
    "llama-fp8-dynamic": "fp8-dynamic",
    "llama-fp8-static": "fp8-static-tensor",
    "llama-w4a16-channel": "w4a16-channel",
    "llama-w4a16-gptq-actorder": "w4a16-g128",  # its order is folded into the packing
    "llama-w8a16-g64-asym": "w8a16-g64-asym",
    "qwen2-w4a16-g64-asym": "w4a16-g64-asym",
}
PACKED = {
    "llama-awq-gemm-g128": "awq-w4-g128",
    "llama-gptq-g128-desc-act": "gptq-w4-g128-actorder",
}


@pytest.fixture
def triton_kernels(monkeypatch):
    monkeypatch.setenv("LORAPLEX_LORA_BACKEND", "triton")


def _mixed_batches(engine: LLMEngine, lora=None) -> set:
    """The launch keys of a run of chunked prefills beside decodes, then a lone decode."""
    from inference.kernels.compilation import recorded_launches

    rounds = [
        [(list(range(5, 25)), 3), ([5, 6], 4)],  # one prefill chunked, beside a short one
        [(list(range(7, 22)), 2), ([9] * 6, 3), ([3], 2)],
        [([8, 9, 10], 1)],
    ]
    with recorded_launches(execute=True) as launched:
        for i, requests in enumerate(rounds):
            for j, (prompt, tokens) in enumerate(requests):
                params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
                engine.add_request(
                    EngineRequest(
                        f"q{i}-{j}",
                        prompt_token_ids=prompt,
                        sampling_params=params,
                        lora_request=lora if j % 2 == 0 else None,
                    )
                )
            results = run_all(engine)
            assert all(r["error"] is None for r in results.values())
    return set(launched)


def _check_listed(engine: LLMEngine, met: set, scheme: str) -> None:
    assert engine_shapes(engine.config).quant_schemes == (scheme,)
    assert check_quant_schemes((scheme,)) == (scheme,)  # the compile check's --quant takes it
    listed = listed_variants(engine.config)
    assert {k.kernel for k in met} & QUANT_KERNELS, "the quantized layers ran no Triton GEMM"
    unlisted = sorted(_nearest(k, listed) for k in met - listed)
    assert not unlisted, f"{scheme}: launched but never compiled at start-up:\n" + "\n".join(
        unlisted
    )


def _nearest(key, listed: set) -> str:
    """`key`, and how the listed variant of its kernel and constants nearest it differs."""
    same = [k for k in listed if (k.kernel, k.constexprs, k.options) == (key.kernel,
            key.constexprs, key.options)]  # fmt: skip
    if not same:
        return f"{key.describe()}{key.args} (no listed variant has its constants)"
    near = min(same, key=lambda k: len(set(k.args) ^ set(key.args)))
    differ = [(a, b) for a, b in zip(key.args, near.args, strict=True) if a != b]
    return f"{key.describe()}: launched/listed {differ}"


@pytest.mark.parametrize("name", sorted(COMPRESSED))
def test_compressed_tensors_launches_are_listed(compressed_checkpoints, triton_kernels, name):
    engine = LLMEngine(model=compressed_checkpoints.folders[name], **SETTINGS)
    _check_listed(engine, _mixed_batches(engine), COMPRESSED[name])


@pytest.mark.parametrize("name", sorted(PACKED))
def test_awq_and_gptq_launches_are_listed(packed_checkpoints, triton_kernels, name):
    """Repacked into pack-quantized at load, with fp32 scales and zero points; with LoRA
    adapters on top (the shrink and expand launches are listed too)."""
    engine = LLMEngine(
        model=packed_checkpoints.folders[name],
        enable_lora=True,
        max_loras=1,
        max_lora_rank=16,
        **SETTINGS,
    )
    lora = request_for("llama", packed_checkpoints.adapters["llama"])
    _check_listed(engine, _mixed_batches(engine, lora), PACKED[name])


def test_bf16_serving_of_an_fp32_checkpoint_lists_its_fp32_scales(
    compressed_checkpoints, triton_kernels
):
    """compressed-tensors' scales keep the checkpoint's dtype whatever the engine computes
    in: the list follows config.json's, not the engine's."""
    engine = LLMEngine(
        model=compressed_checkpoints.folders["llama-w4a16"], dtype="bfloat16", **SETTINGS
    )
    _check_listed(engine, _mixed_batches(engine), "w4a16-g128")


def test_the_torch_backend_lists_no_quantized_gemm(compressed_checkpoints, monkeypatch):
    monkeypatch.setenv("LORAPLEX_LORA_BACKEND", "torch")
    engine = LLMEngine(model=compressed_checkpoints.folders["llama-w4a16"], **SETTINGS)
    assert engine_shapes(engine.config).quant_schemes == ()
    assert not {k.kernel for k in listed_variants(engine.config)} & QUANT_KERNELS
    config = engine.config
    assert launches_kernels(config)  # its attention is still Triton's


def test_tensor_parallel_fp8_lists_its_row_parallel_gemms_weight_only():
    """Split over ranks, o_proj and down_proj quantize a token by its whole row's amax
    themselves and multiply weight-only; the column-parallel projections keep fp8 dots."""
    import dataclasses

    import torch

    from inference.kernels.compilation import EngineShapes
    from inference.kernels.compilation.compile import listed_keys
    from inference.kernels.lora_tiles import DEFAULT_TABLE

    shapes = EngineShapes(name="tiny", dtype=torch.bfloat16, hidden=64, intermediate=128,
                          num_heads=4, num_kv_heads=2, head_dim=16, windows=(None,),
                          softcap=None, max_model_len=64, max_num_seqs=4,
                          max_num_batched_tokens=16, quant_schemes=("fp8-dynamic",))  # fmt: skip

    def kernels(tp: int) -> set[str]:
        keys = listed_keys([dataclasses.replace(shapes, tensor_parallel=tp)], DEFAULT_TABLE)
        return {k.kernel for k in keys} & QUANT_KERNELS

    assert kernels(1) == {"fp8_quantize_rows_kernel", "fp8_gemm_kernel"}
    assert kernels(2) == kernels(1) | {"fp8_weight_only_gemm_kernel"}
