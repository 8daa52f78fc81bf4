"""The tiny bases every quantized fixture starts from, shared by the quantizing venv's script
and the main venv's packer.

Every quantized input dimension is a multiple of 128 per tensor-parallel rank of 2 for Llama
(so groups of 128 never straddle ranks) and of 64 for Qwen2 (its o_proj takes 4 heads of 32).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.tiny_models import make_tiny_model

# family -> make_tiny_model overrides
BASES: dict[str, dict[str, Any]] = {
    # head_dim 64: o_proj's input is 256, as is down_proj's
    "llama": {"hidden_size": 128, "intermediate_size": 256, "head_dim": 64},
    "qwen2": {"hidden_size": 128, "intermediate_size": 256, "use_sliding_window": False},
}
SEED = 1


def make_base(out_dir: Path, family: str) -> Path:
    """`<out_dir>/<family>-base`: a seeded random fp32 model with the tests' tokenizer."""
    return make_tiny_model(out_dir / f"{family}-base", family, seed=SEED, **BASES[family])
