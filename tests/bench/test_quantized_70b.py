"""bench/quantized_70b.py's arithmetic: the published size of Llama-3-70B, and on a tiny model
the bytes the engine itself allocates for weights, a LoRA slot and a KV token."""

import json
import sys
from pathlib import Path

import torch

from inference.engine import LLMEngine
from tests.tiny_models import make_tiny_model

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from quantized_70b import (  # noqa: E402
    LLAMA_3_70B,
    kv_bytes_per_token,
    lora_slot_bytes,
    parameters,
    shapes_of,
    weights_bytes,
)


def test_llama_3_70b_has_its_published_size():
    assert parameters(LLAMA_3_70B) == 70_553_706_496
    assert weights_bytes(LLAMA_3_70B) == 2 * parameters(LLAMA_3_70B)
    assert kv_bytes_per_token(LLAMA_3_70B) == 320 * 1024  # 2 x 80 layers x 8 heads x 128 x 2
    # FP8: a byte per linear weight and a bf16 scale per output channel; the rest 16-bit
    fp8 = weights_bytes(LLAMA_3_70B, 8)
    assert fp8 == 68_451_041_280 + 2 * 80 * 83_968 + 2 * (2 * 128_256 * 8192 + 161 * 8192)


def test_the_figures_are_the_engines_own_on_a_tiny_model(tmp_path):
    folder = make_tiny_model(tmp_path / "tiny", "llama", num_layers=2)
    shapes = shapes_of(json.loads((folder / "config.json").read_text()))
    engine = LLMEngine(model=str(folder), device="cpu", dtype="bfloat16",
                       kv_cache_bytes=1 << 22, enable_lora=True, max_loras=1,
                       max_lora_rank=16)  # fmt: skip
    try:
        assert engine.model_runner.weights_bytes == weights_bytes(shapes)
        assert engine.model_runner.lora_slots.row_nbytes == lora_slot_bytes(shapes, 16)
        config = engine.config
        per_token = config.kv_block_bytes // config.block_size
        assert per_token == kv_bytes_per_token(shapes, torch.bfloat16.itemsize)
    finally:
        engine.close()
