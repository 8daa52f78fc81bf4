"""Multi-LoRA shrink (x @ A^T) and expand (y @ B^T) on the Triton kernels, all slices in one
launch: this module picks the path, grid and split of each launch (triton_kernels.py holds
the kernels).

Two paths, chosen per step by `make_lora_batch`: SGMV (prefill), a program per block of one
segment's tokens, and BGMV (decode), a program per token.

The slices of a merged linear (q/k/v, gate/up) are separate stacked tensors. Their addresses
and per-slice strides and widths go to the kernel through a small int64 table (cached, since
the engine allocates the stacks once), so one launch covers every slice.

Numerics (triton_kernels.py says why): with bf16/fp16 weights the SGMV dots run on tf32
tensor cores, exact for the shrink; the expand rounds y (fp32) to tf32. fp32 weights use
IEEE dots to match the torch reference. Split-K shrinks meet by fp32 atomics, whose order
varies run to run; a deterministic batch (the engine's deterministic_kernels setting,
LoRABatch.deterministic) turns the split off, so every sum runs in one program in a fixed
order.
Set TRITON_INTERPRET=1 before importing this module to run it on CPU tensors (tests only).

Tile sizes, the split of a shrink's reduction and num_warps / num_stages come from the tile
table (lora_tiles.py) for the device's GPU model, looked up in `launch_tiles` for every
launch; `tiles=` forces one choice (the tuner and tests). `check_tiles` refuses, at engine
start, a table entry the device could not launch (tile_limits.py).
"""

import dataclasses
import functools
from collections.abc import Collection, Mapping, Sequence

import torch
import triton

from inference.kernels.lora_batch import LoRABatch
from inference.kernels.lora_tiles import Tiles, TileTable, check_reachable, table_for_gpu
from inference.kernels.tile_limits import device_limits
from inference.kernels.triton_kernels import (
    bgmv_expand_kernel,
    bgmv_shrink_kernel,
    sgmv_expand_kernel,
    sgmv_shrink_kernel,
)

# Never dropped: a captured CUDA graph keeps their addresses (a few int64s per weight stack)
_tables: dict[tuple[torch.device, tuple[tuple[int, ...], ...]], torch.Tensor] = {}
_FITTED_CACHE_SIZE = 1024
_fitted: dict[tuple[Tiles, int, int, int], Tiles] = {}
# fp32 SGMV shrinks use IEEE dots (FMAs, operands in registers) on the tile table's 16-bit
# tiles: a 64 x 128 x tile at rank 32 spills ~11 KB per thread on sm_80; 64-wide K fits.
FP32_SHRINK_BLOCK_K = 64


def _runs(weights: list[torch.Tensor]) -> list[tuple[int, int]]:
    """Consecutive slices sharing inner strides; each run is one launch (usually all slices)."""
    runs, first = [], 0
    for i in range(1, len(weights) + 1):
        if i == len(weights) or weights[i].stride()[1:] != weights[first].stride()[1:]:
            runs.append((first, i))
            first = i
    return runs


def _table(rows: Sequence[tuple[int, ...]], device: torch.device) -> torch.Tensor:
    """Device copy of per-slice (address, strides, ...) rows, cached: the stacks never move."""
    key = (device, tuple(rows))
    table = _tables.get(key)
    if table is None:
        table = _tables[key] = torch.tensor(rows, dtype=torch.int64, device=device)
    return table


def _block_r(rank: int) -> int:
    return max(16, int(triton.next_power_of_2(rank)))  # tl.dot needs every tile dim >= 16 on a GPU


@functools.lru_cache(maxsize=8)
def _device_table(device: torch.device, itemsize: int = 2) -> TileTable:
    if device.type != "cuda":
        return table_for_gpu(None)
    name = torch.cuda.get_device_name(device)
    return table_for_gpu(name, limits=device_limits(device), itemsize=itemsize)


def check_tiles(
    device: torch.device,
    itemsize: int,
    rank: int,
    hiddens: Mapping[str, Collection[int]],
    max_tokens: int,
) -> None:
    """Refuse now, not on a request, a tile the engine could launch on `device` that cannot
    run there: the device's table loads with its limits (its file's entries checked at
    their own rank), then every entry the engine's lookups can reach is checked at this
    rank (`check_reachable`). Launches only ever shrink the table's tiles (`launch_tiles`)."""
    table = _device_table(device, itemsize)
    if device.type != "cuda":
        return
    try:
        check_reachable(table, device_limits(device), itemsize, rank, hiddens, max_tokens)
    except ValueError as error:
        raise ValueError(
            f"LoRA tile table for {torch.cuda.get_device_name(device)}: {error}"
        ) from None


def launch_tiles(
    op: str,
    batch: LoRABatch,
    rank: int,
    hidden: int,
    device: torch.device,
    tiles: Tiles | None,
    itemsize: int = 2,
) -> Tiles:
    """The tiles of one launch: the table's (or the forced) choice, fitted to the batch. A
    token block is no taller than the longest segment needs, an fp32 SGMV shrink's K tile no
    wider than FP32_SHRINK_BLOCK_K, a split no finer than K's tiles (hidden is K for a
    shrink), and none for a deterministic batch: a split's programs add
    their partial sums with fp32 atomics in whatever order they finish, so a sum's last bits
    (and then a greedy near-tie) could change run to run; unsplit, each sum is one
    program's loop. That costs small batches their parallelism: at decode batch 1, about
    one dependent load per K tile (16 at K 4096) instead of one in all."""
    if tiles is None:
        table = _device_table(device, itemsize)
        tiles = table.lookup(op, batch.path, rank, hidden, batch.num_tokens)
    block_m, block_k = tiles.block_m, tiles.block_k
    if batch.path == "sgmv":
        block_m = min(block_m, max(16, int(triton.next_power_of_2(batch.max_seg_len))))
        if op == "shrink" and itemsize >= 4:
            block_k = min(block_k, FP32_SHRINK_BLOCK_K)
    split_k = min(tiles.split_k, triton.cdiv(hidden, block_k)) if op == "shrink" else 1
    if batch.deterministic:
        split_k = 1
    if (block_m, block_k, split_k) == (tiles.block_m, tiles.block_k, tiles.split_k):
        return tiles
    key = (tiles, block_m, block_k, split_k)
    fitted = _fitted.get(key)
    if fitted is None:
        if len(_fitted) >= _FITTED_CACHE_SIZE:
            _fitted.clear()
        fitted = dataclasses.replace(tiles, block_m=block_m, block_k=block_k, split_k=split_k)
        _fitted[key] = fitted
    return fitted


def _precision(dtype: torch.dtype) -> str:
    """tl.dot's input precision for SGMV: tf32 with 16-bit weights (see triton_kernels.py)."""
    return "ieee" if dtype == torch.float32 else "tf32"


def lora_shrink(
    x: torch.Tensor,
    lora_a: list[torch.Tensor],
    batch: LoRABatch,
    out: torch.Tensor,
    tiles: Tiles | None = None,
) -> None:
    for first, last in _runs(lora_a):
        _shrink(x, lora_a[first:last], batch, out[first:last], tiles)


def _shrink(
    x: torch.Tensor,
    lora_a: list[torch.Tensor],
    batch: LoRABatch,
    y: torch.Tensor,
    tiles: Tiles | None,
) -> None:
    n = len(lora_a)
    _, rank, k = lora_a[0].shape
    t = launch_tiles("shrink", batch, rank, k, x.device, tiles, x.element_size())
    table = _table([(a.data_ptr(), a.stride(0)) for a in lora_a], x.device)
    split_k = t.split_k if y.dtype == torch.float32 else 1  # partial sums meet by fp32 atomics
    if split_k > 1:
        y.zero_()
    strides = (
        k, rank, *x.stride(), lora_a[0].stride(1), lora_a[0].stride(2), *y.stride(),
    )  # fmt: skip
    launch = {"num_warps": t.num_warps, "num_stages": t.num_stages}
    if batch.path == "sgmv":
        grid = (triton.cdiv(batch.max_seg_len, t.block_m), split_k, batch.num_segments * n)
        sgmv_shrink_kernel[grid](
            x, table, lora_a[0], y,
            batch.sorted_token_ids, batch.seg_starts, batch.seg_lens, batch.seg_slots,
            *strides, N_SLICES=n, BLOCK_M=t.block_m, BLOCK_R=_block_r(rank), BLOCK_K=t.block_k,
            SPLIT_K=split_k, PRECISION=_precision(x.dtype), **launch,
        )  # fmt: skip
    else:
        bgmv_shrink_kernel[(batch.num_tokens, split_k, n)](
            x, table, lora_a[0], y, batch.token_slots,
            *strides, BLOCK_R=_block_r(rank), BLOCK_K=t.block_k, SPLIT_K=split_k, **launch,
        )  # fmt: skip


def lora_expand(
    y: torch.Tensor,
    lora_b: list[torch.Tensor],
    scales: torch.Tensor,
    batch: LoRABatch,
    out: torch.Tensor,
    add: bool = True,
    tiles: Tiles | None = None,
) -> None:
    offsets = [0]
    for b in lora_b:
        offsets.append(offsets[-1] + b.shape[1])
    for first, last in _runs(lora_b):
        _expand(
            y[first:last], lora_b[first:last], offsets[first:last], scales, batch, out, add, tiles
        )


def _expand(
    y: torch.Tensor,
    lora_b: list[torch.Tensor],
    offsets: list[int],
    scales: torch.Tensor,
    batch: LoRABatch,
    out: torch.Tensor,
    add: bool,
    tiles: Tiles | None,
) -> None:
    n = len(lora_b)
    rows = [
        (b.data_ptr(), b.stride(0), b.shape[1], off) for b, off in zip(lora_b, offsets, strict=True)
    ]
    table = _table(rows, out.device)
    rank = lora_b[0].shape[2]
    width = max(b.shape[1] for b in lora_b)
    t = launch_tiles("expand", batch, rank, width, out.device, tiles, out.element_size())
    grid_n = triton.cdiv(width, t.block_n)
    strides = (rank, *y.stride(), lora_b[0].stride(1), lora_b[0].stride(2), *out.stride())
    launch = {"num_warps": t.num_warps, "num_stages": t.num_stages}
    if batch.path == "sgmv":
        grid = (triton.cdiv(batch.max_seg_len, t.block_m), grid_n, batch.num_segments * n)
        sgmv_expand_kernel[grid](
            y, table, lora_b[0], out, scales,
            batch.sorted_token_ids, batch.seg_starts, batch.seg_lens, batch.seg_slots,
            *strides, N_SLICES=n, BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_R=_block_r(rank),
            ADD=add, PRECISION=_precision(out.dtype), **launch,
        )  # fmt: skip
    else:
        bgmv_expand_kernel[(batch.num_tokens, grid_n, n)](
            y, table, lora_b[0], out, scales, batch.token_slots,
            *strides, BLOCK_N=t.block_n, BLOCK_R=_block_r(rank), ADD=add, **launch,
        )  # fmt: skip
