"""Small helpers the engine's modules share."""

import queue
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

import torch

T = TypeVar("T")


def drain(items: "queue.SimpleQueue[T]") -> Iterator[T]:
    """What another thread has queued so far, oldest first, without waiting for more."""
    while True:
        try:
            yield items.get_nowait()
        except queue.Empty:
            return


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Create parameters directly in `dtype` (no float32 copy on the way)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def to_device(
    values: list[float] | list[int] | list[list[float]] | list[list[int]],
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """A host list on `device`. To CUDA through pinned memory and without blocking: a plain
    copy from pageable memory would wait for the device to finish its queued work."""
    host = torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
