"""What one launch of a LoRA kernel needs from the device, and what the device allows, so a
tile table (lora_tiles.py) the device could not run is refused when it is loaded and when the
engine starts, never on a live request.

Shared memory per program is what makes a launch fail ("out of resource: shared memory").
The estimate follows how Triton lays these kernels out, read from `kernel.metadata.shared`
on triton 3.6 and 3.9 for sm_80 and sm_90 (tests/kernels/test_tile_limits.py keeps it an
upper bound over the default table and a spread of tiles):
- SGMV shrink loops over K with tl.dot. The pipeliner keeps num_stages - 1 x tiles
  (BLOCK_M x BLOCK_K, storage dtype) in flight through cp.async; A's tile, whose address
  comes from the slot table (alignment unknown, so never cp.async), is staged once for the
  dot, in fp32 at most. With fp32 inputs (IEEE dots on CUDA cores) A is pipelined with x.
- SGMV expand has no loop: y's tile (fp32) and B's tile (fp32 at most) are staged once.
- After the loop or the dot, the fp32 accumulator may go through shared memory once to
  change layout for the store, up to the whole tile; the loop's buffers are free by then.
- BGMV is vector-matrix with tl.sum: only the cross-warp partial sums (one a warp per row
  at most) and the vector's change of layout, a few KB at most.

Registers: the fp32 tiles a program computes on at once, per thread. Past the 255 registers
a thread can have, a tile cannot be held at all and lives in local memory (the tuner would
never pick it; a file that names it is wrong).
"""

from dataclasses import dataclass
from typing import Protocol

import torch

FP32 = 4
MAX_REGISTERS_PER_THREAD = 255
# Shared memory per block with opt-in, the most a Triton launch may use, by compute
# capability (CUDA programming guide, "Technical Specifications per Compute Capability").
SHARED_MEMORY_BY_CAPABILITY = {
    (7, 0): 98304,
    (7, 5): 65536,
    (8, 0): 166912,
    (8, 6): 101376,
    (8, 7): 166912,
    (8, 9): 101376,
    (9, 0): 232448,
    (10, 0): 232448,
    (12, 0): 101376,
}
SHARED_MEMORY_WITHOUT_OPT_IN = 49152  # every CUDA device since Kepler: the safe floor


class TileShape(Protocol):
    """The fields of lora_tiles.Tiles a launch's needs depend on. A protocol, so lora_tiles
    (which checks its tables here) imports this module and not the other way round."""

    @property
    def block_m(self) -> int: ...
    @property
    def block_k(self) -> int: ...
    @property
    def block_n(self) -> int: ...
    @property
    def num_warps(self) -> int: ...
    @property
    def num_stages(self) -> int: ...


@dataclass(frozen=True)
class DeviceLimits:
    shared_memory: int  # bytes per block
    registers_per_thread: int = MAX_REGISTERS_PER_THREAD


def limits_for_capability(major: int, minor: int) -> DeviceLimits:
    return DeviceLimits(
        SHARED_MEMORY_BY_CAPABILITY.get((major, minor), SHARED_MEMORY_WITHOUT_OPT_IN)
    )


def device_limits(device: torch.device) -> DeviceLimits:
    """A CUDA device's limits: torch's figure where it has one, else the capability's."""
    props = torch.cuda.get_device_properties(device)
    optin = getattr(props, "shared_memory_per_block_optin", None)
    if isinstance(optin, int) and optin > 0:
        return DeviceLimits(optin)
    return limits_for_capability(props.major, props.minor)


def block_r(rank: int) -> int:
    """The rank the kernels pad to: a power of two, at least the 16 tl.dot needs."""
    return max(16, 1 << max(0, rank - 1).bit_length())


def shared_memory_bytes(op: str, path: str, tiles: TileShape, rank: int, itemsize: int) -> int:
    """Upper bound of one program's shared memory (see the module docstring); `itemsize` is
    the bytes of an element of x / out and of the weights (the model's dtype)."""
    r = block_r(rank)
    if path == "bgmv":
        vector = tiles.block_k if op == "shrink" else tiles.block_n
        return (vector + r) * tiles.num_warps * FP32
    in_flight = max(tiles.num_stages - 1, 1)
    if op == "shrink":
        x, a = tiles.block_m * tiles.block_k * itemsize, tiles.block_k * r * FP32
        loop = in_flight * (x + a) if itemsize == FP32 else in_flight * x + a
        return max(loop, tiles.block_m * r * FP32)
    operands = (tiles.block_m * r + r * tiles.block_n) * FP32
    return max(operands, tiles.block_m * tiles.block_n * FP32)


def register_tile(op: str, path: str, tiles: TileShape, rank: int) -> int:
    """fp32 elements per thread of the tiles one program computes on at once: A or B's tile
    for BGMV; for SGMV the accumulator and the dot's operand held in registers."""
    r = block_r(rank)
    if path == "bgmv":
        elements = r * (tiles.block_k if op == "shrink" else tiles.block_n)
    elif op == "shrink":
        elements = tiles.block_m * (r + tiles.block_k)
    else:
        elements = tiles.block_m * (r + tiles.block_n)
    return -(-elements // (32 * tiles.num_warps))


def launch_problem(
    op: str, path: str, tiles: TileShape, rank: int, itemsize: int, limits: DeviceLimits
) -> str | None:
    """Why a launch of these tiles cannot run on a device with `limits`, or None."""
    shared = shared_memory_bytes(op, path, tiles, rank, itemsize)
    if shared > limits.shared_memory:
        return f"needs {shared:,} B of shared memory, the device allows {limits.shared_memory:,}"
    registers = register_tile(op, path, tiles, rank)
    if registers > limits.registers_per_thread:
        return (
            f"holds {registers} fp32 values per thread in its tiles, a thread has at most "
            f"{limits.registers_per_thread} registers"
        )
    return None
