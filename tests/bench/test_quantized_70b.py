"""bench/quantized_70b.py's arithmetic (the capacity planner's): the published size of
Llama-3-70B, and on a tiny model the bytes the engine itself allocates for weights, a LoRA
slot and a KV token."""

import json
import sys
from pathlib import Path

from inference.engine import LLMEngine
from inference.engine.planning import PlanRequest, device_named, plan
from tests.tiny_models import make_tiny_model

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from quantized_70b import GIB, fit  # noqa: E402

PARAMETERS = 70_553_706_496


def test_llama_3_70b_has_its_published_size():
    bf16 = fit("bf16", 0, total=139 * GIB, utilization=0.9, rank=16)
    assert bf16.weights_bytes_per_gpu == 2 * PARAMETERS and not bf16.fits
    assert bf16.kv_bytes_per_token_per_gpu == 320 * 1024  # 2 x 80 layers x 8 heads x 128 x 2
    # FP8: a byte per linear weight and a bf16 scale per output channel; the rest 16-bit
    fp8 = fit("fp8", 32, total=139 * GIB, utilization=0.9, rank=16)
    assert fp8.weights_bytes_per_gpu == (
        68_451_041_280 + 2 * 80 * 83_968 + 2 * (2 * 128_256 * 8192 + 161 * 8192)
    )
    assert fp8.fits and fp8.device_slots == 32 and fp8.kv_tokens > 100_000


def test_the_figures_are_the_engines_own_on_a_tiny_model(tmp_path):
    folder = make_tiny_model(tmp_path / "tiny", "llama", num_layers=2)
    planned = plan(
        PlanRequest(
            config=json.loads((folder / "config.json").read_text()),
            device=device_named("cpu", 1 << 30),
            dtype="bfloat16",
            rank=16,
            prompt_tokens=64,
            output_tokens=64,
            concurrency=1,
        )
    )
    engine = LLMEngine(model=str(folder), device="cpu", dtype="bfloat16",
                       kv_cache_bytes=1 << 22, enable_lora=True, max_loras=1,
                       max_lora_rank=16)  # fmt: skip
    try:
        assert engine.model_runner.weights_bytes == planned.weights_bytes_per_gpu
        assert engine.model_runner.lora_slots.row_nbytes == planned.adapter_bytes_per_gpu
        config = engine.config
        assert config.kv_block_bytes // config.block_size == planned.kv_bytes_per_token_per_gpu
    finally:
        engine.close()
