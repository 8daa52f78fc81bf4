"""Which implementation of the LoRA ops and of paged attention runs on a device.

Triton kernels on CUDA, the torch reference everywhere else. The Triton module is never
imported here: on a CPU host it would fail at the first launch ("0 active drivers"), and
importing it is slow, so the ops import it lazily when the backend is "triton".
"""

import functools
import importlib.util
import os

import torch

BACKENDS = ("torch", "triton")
ENV_VAR = "LORAPLEX_LORA_BACKEND"


@functools.cache
def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def select_backend(device: torch.device | str) -> str:
    """ "triton" on CUDA when triton is installed, else "torch"; $LORAPLEX_LORA_BACKEND
    overrides."""
    device = torch.device(device)
    forced = os.environ.get(ENV_VAR, "").strip().lower()
    if forced:
        check_backend(forced, device, source=f"${ENV_VAR}")
        return forced
    return "triton" if device.type == "cuda" and triton_available() else "torch"


def attention_backend(requested: str, device: torch.device | str) -> str:
    """ "auto": the Triton paged-attention kernels on CUDA when triton is installed, the torch
    reference elsewhere; "torch" or "triton" as asked, if it can run on `device`."""
    device = torch.device(device)
    if requested == "auto":
        return "triton" if device.type == "cuda" and triton_available() else "torch"
    check_backend(requested, device, source="attention_backend")
    return requested


def check_backend(backend: str, device: torch.device, source: str = "backend") -> None:
    """Refuse a backend that cannot run on `device`, before any kernel launch fails obscurely."""
    if backend not in BACKENDS:
        raise ValueError(f"{source}={backend!r} is not a kernel backend; use one of {BACKENDS}")
    if backend != "triton":
        return
    if not triton_available():
        raise ValueError(f"{source}='triton' but triton is not installed; use 'torch'")
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            f"{source}='triton' on a {device.type} device needs TRITON_INTERPRET=1 set before "
            "any Triton kernel module is imported (tests only); use 'torch' on CPU"
        )
