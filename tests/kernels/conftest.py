"""Kernel tests run the Triton kernels on CPU tensors through Triton's interpreter.

TRITON_INTERPRET is read when a module defining @triton.jit kernels is imported, so it is set
here, before any test module can import inference.kernels.lora_triton.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
