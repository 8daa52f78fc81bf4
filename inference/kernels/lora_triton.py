"""Multi-LoRA shrink (x @ A^T) and expand (y @ B^T) on the Triton kernels, all slices in one
launch: this module picks the path, grid and split of each launch (triton_kernels.py holds
the kernels).

Two paths, chosen per step by `make_lora_batch`: SGMV (prefill), a program per block of one
segment's tokens, and BGMV (decode), a program per token.

The slices of a merged linear (q/k/v, gate/up) are separate stacked tensors. Their addresses
and per-slice strides and widths go to the kernel through a small int64 table (cached, since
the engine allocates the stacks once), so one launch covers every slice.

On a GPU, bf16/fp16 tiles upcast to fp32 are exact in tf32, so their dots use tensor cores
without losing input bits; fp32 inputs use full-precision dots to match the torch reference.
Set TRITON_INTERPRET=1 before importing this module to run it on CPU tensors (tests only).
"""

from collections.abc import Sequence

import torch
import triton

from inference.kernels.lora_batch import LoRABatch
from inference.kernels.triton_kernels import (
    bgmv_expand_kernel,
    bgmv_shrink_kernel,
    sgmv_expand_kernel,
    sgmv_shrink_kernel,
)

SGMV_BLOCK_K = 64
BGMV_BLOCK_K = 128
BLOCK_N = 64
# Shrink splits its reduction over `in` until about this many programs run: a decode step
# has a handful of (token, slice) pairs, far fewer than a GPU has SMs.
TARGET_PROGRAMS = 256
_TABLE_CACHE_SIZE = 1024
_tables: dict[tuple[torch.device, tuple[tuple[int, ...], ...]], torch.Tensor] = {}


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
        if len(_tables) >= _TABLE_CACHE_SIZE:
            _tables.clear()
        table = _tables[key] = torch.tensor(rows, dtype=torch.int64, device=device)
    return table


def _block_r(rank: int) -> int:
    return max(16, int(triton.next_power_of_2(rank)))  # tl.dot needs every tile dim >= 16 on a GPU


def _block_m(batch: LoRABatch) -> int:
    return min(64, max(16, int(triton.next_power_of_2(batch.max_seg_len))))


def _precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"


def lora_shrink(
    x: torch.Tensor, lora_a: list[torch.Tensor], batch: LoRABatch, out: torch.Tensor
) -> None:
    for first, last in _runs(lora_a):
        _shrink(x, lora_a[first:last], batch, out[first:last])


def _shrink(x: torch.Tensor, lora_a: list[torch.Tensor], batch: LoRABatch, y: torch.Tensor) -> None:
    n = len(lora_a)
    _, rank, k = lora_a[0].shape
    table = _table([(a.data_ptr(), a.stride(0)) for a in lora_a], x.device)
    sgmv = batch.path == "sgmv"
    block_k = SGMV_BLOCK_K if sgmv else BGMV_BLOCK_K
    grid_m = triton.cdiv(batch.max_seg_len, _block_m(batch)) if sgmv else batch.num_tokens
    programs = grid_m * (batch.num_segments if sgmv else 1) * n
    split_k = 1
    if y.dtype == torch.float32:  # partial sums meet through fp32 atomics
        while programs * split_k < TARGET_PROGRAMS and split_k * 2 <= triton.cdiv(k, block_k):
            split_k *= 2
    if split_k > 1:
        y.zero_()
    strides = (
        k, rank, *x.stride(), lora_a[0].stride(1), lora_a[0].stride(2), *y.stride(),
    )  # fmt: skip
    block_r = _block_r(rank)
    if sgmv:
        sgmv_shrink_kernel[(grid_m, split_k, batch.num_segments * n)](
            x, table, lora_a[0], y,
            batch.sorted_token_ids, batch.seg_starts, batch.seg_lens, batch.seg_slots,
            *strides, N_SLICES=n, BLOCK_M=_block_m(batch), BLOCK_R=block_r, BLOCK_K=block_k,
            SPLIT_K=split_k, PRECISION=_precision(x.dtype),
        )  # fmt: skip
    else:
        bgmv_shrink_kernel[(grid_m, split_k, n)](
            x, table, lora_a[0], y, batch.token_slots,
            *strides, BLOCK_R=block_r, BLOCK_K=block_k, SPLIT_K=split_k,
        )  # fmt: skip


def lora_expand(
    y: torch.Tensor,
    lora_b: list[torch.Tensor],
    scales: torch.Tensor,
    batch: LoRABatch,
    out: torch.Tensor,
    add: bool = True,
) -> None:
    offsets = [0]
    for b in lora_b:
        offsets.append(offsets[-1] + b.shape[1])
    for first, last in _runs(lora_b):
        _expand(y[first:last], lora_b[first:last], offsets[first:last], scales, batch, out, add)


def _expand(
    y: torch.Tensor,
    lora_b: list[torch.Tensor],
    offsets: list[int],
    scales: torch.Tensor,
    batch: LoRABatch,
    out: torch.Tensor,
    add: bool,
) -> None:
    n = len(lora_b)
    rows = [
        (b.data_ptr(), b.stride(0), b.shape[1], off) for b, off in zip(lora_b, offsets, strict=True)
    ]
    table = _table(rows, out.device)
    rank = lora_b[0].shape[2]
    grid_n = triton.cdiv(max(b.shape[1] for b in lora_b), BLOCK_N)
    strides = (rank, *y.stride(), lora_b[0].stride(1), lora_b[0].stride(2), *out.stride())
    if batch.path == "sgmv":
        block_m = _block_m(batch)
        grid = (triton.cdiv(batch.max_seg_len, block_m), grid_n, batch.num_segments * n)
        sgmv_expand_kernel[grid](
            y, table, lora_b[0], out, scales,
            batch.sorted_token_ids, batch.seg_starts, batch.seg_lens, batch.seg_slots,
            *strides, N_SLICES=n, BLOCK_M=block_m, BLOCK_N=BLOCK_N, BLOCK_R=_block_r(rank),
            ADD=add, PRECISION=_precision(out.dtype),
        )  # fmt: skip
    else:
        bgmv_expand_kernel[(batch.num_tokens, grid_n, n)](
            y, table, lora_b[0], out, scales, batch.token_slots,
            *strides, BLOCK_N=BLOCK_N, BLOCK_R=_block_r(rank), ADD=add,
        )  # fmt: skip
