"""Backend choice: Triton only where it can run, and never imported by a CPU engine."""

import pytest
import torch

from inference.kernels import select_backend
from tests.fresh_python import modules_after


def test_cpu_uses_the_torch_reference(monkeypatch):
    monkeypatch.delenv("LORAPLEX_LORA_BACKEND", raising=False)
    assert select_backend("cpu") == "torch"
    assert select_backend(torch.device("cpu")) == "torch"


def test_cuda_uses_triton(monkeypatch):
    monkeypatch.delenv("LORAPLEX_LORA_BACKEND", raising=False)
    assert select_backend("cuda") == "triton"


def test_the_environment_overrides_the_choice(monkeypatch):
    monkeypatch.setenv("LORAPLEX_LORA_BACKEND", "torch")
    assert select_backend("cuda") == "torch"
    monkeypatch.setenv("LORAPLEX_LORA_BACKEND", "Triton")
    assert select_backend("cpu") == "triton"  # the tests run under TRITON_INTERPRET=1


def test_an_unknown_backend_in_the_environment_is_refused(monkeypatch):
    monkeypatch.setenv("LORAPLEX_LORA_BACKEND", "cutlass")
    with pytest.raises(
        ValueError, match=r"\$LORAPLEX_LORA_BACKEND='cutlass' is not a kernel backend"
    ):
        select_backend("cpu")


def test_triton_on_cpu_without_the_interpreter_is_refused(monkeypatch):
    monkeypatch.setenv("LORAPLEX_LORA_BACKEND", "triton")
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="needs TRITON_INTERPRET=1"):
        select_backend("cpu")


def test_a_cpu_engine_never_imports_triton():
    script = (
        "import sys, torch\n"
        "from inference.kernels import add_lora, make_lora_batch\n"
        "b = make_lora_batch(torch.tensor([0, -1]))\n"
        "a, bb = [torch.ones(1, 4, 8)], [torch.ones(1, 8, 4)]\n"
        "out = torch.zeros(2, 8)\n"
        "add_lora(out, torch.ones(2, 8), a, bb, torch.ones(1), b)\n"
        "assert b.backend == 'torch' and out[0].eq(32).all() and out[1].eq(0).all(), out\n"
    )
    modules = modules_after(script, env={"PATH": "/usr/bin:/bin"})
    assert "triton" not in modules, "triton was imported"
    assert not modules & {"django", "rest_framework"}
