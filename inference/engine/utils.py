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
