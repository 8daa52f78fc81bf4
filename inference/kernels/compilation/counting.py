"""Count what Triton compiles: its post-compile hook fires once per variant a process
builds (or loads from Triton's disk cache) for a device, in triton 3.6 and 3.9 alike."""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from triton import knobs


@contextmanager
def count_compilations() -> Iterator[list[str]]:
    """The variants compiled in the block, one description each (kernel, options and
    argument types, as Triton writes them); a serving engine past warm-up adds none."""
    compiled: list[str] = []
    previous = knobs.runtime.jit_post_compile_hook

    def hook(*, repr: str, **kwargs: Any) -> None:
        compiled.append(repr)
        if previous is not None:
            previous(repr=repr, **kwargs)

    knobs.runtime.jit_post_compile_hook = hook
    try:
        yield compiled
    finally:
        knobs.runtime.jit_post_compile_hook = previous
