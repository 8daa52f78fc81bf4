"""Compile for a GPU that is not there: Triton asks its active driver for the target, the
device and the stream; a driver that answers with a target only (`GPUTarget("cuda", 90,
32)`) lets launches made with `warmup=True` go through Triton's real specialisation to PTX
and a cubin (ptxas ships in the triton wheel) on a host with no GPU and no CUDA driver.
"""

from collections.abc import Iterator
from contextlib import contextmanager

from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver

# The most shared memory one block may use (opt-in), in bytes
SHARED_MEMORY_LIMIT = {90: 232_448, 80: 166_912, 89: 101_376, 86: 101_376}
ARCHS = (90, 80)


class TargetOnlyDriver:
    """What JITFunction.run asks a driver for, when nothing runs: its compile target, a
    device key (one per target, so kernels compiled for sm_80 and sm_90 never share a
    cache entry) and a stream."""

    def __init__(self, arch: int):
        self.target = GPUTarget("cuda", arch, 32)
        self.device = f"compile-only:sm_{arch}"

    @staticmethod
    def is_active() -> bool:
        return False  # never chosen by Triton itself

    def get_current_target(self) -> GPUTarget:
        return self.target

    def get_current_device(self) -> str:
        return self.device

    def get_current_stream(self, device: object = None) -> int:
        return 0


@contextmanager
def compile_target(arch: int) -> Iterator[TargetOnlyDriver]:
    """Make Triton's active driver one that compiles for sm_<arch> and runs nothing."""
    previous = driver._active  # None until Triton first looked for a driver
    target = TargetOnlyDriver(arch)
    driver.set_active(target)
    try:
        yield target
    finally:
        driver._active = previous
