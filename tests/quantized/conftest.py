"""Session fixtures: the quantized checkpoints, built once per checkout (checkpoints.py)."""

from __future__ import annotations

import pytest

from tests.quantized import checkpoints


@pytest.fixture(scope="session")
def compressed_checkpoints() -> checkpoints.CompressedCheckpoints:
    """llmcompressor's compressed-tensors folders of the tiny Llama and Qwen2 bases."""
    if not checkpoints.QUANTIZE_STAMP.is_file():
        pytest.skip(
            f"the quantizing venv is not installed in {checkpoints.QUANTIZE_VENV} "
            "(the Makefile installs it)"
        )
    return checkpoints.compressed_checkpoints()


@pytest.fixture(scope="session")
def packed_checkpoints() -> checkpoints.PackedCheckpoints:
    """AutoAWQ and GPTQ folders of the tiny Llama base, their fp32 references, and adapters."""
    return checkpoints.packed_checkpoints()
