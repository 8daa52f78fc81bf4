"""Small helpers the engine's threads share."""

import queue
from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")


def drain(items: "queue.SimpleQueue[T]") -> Iterator[T]:
    """What another thread has queued so far, oldest first, without waiting for more."""
    while True:
        try:
            yield items.get_nowait()
        except queue.Empty:
            return
