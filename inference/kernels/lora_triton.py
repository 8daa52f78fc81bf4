"""Triton kernels for multi-LoRA shrink (x @ A^T) and expand (y @ B^T), all slices in one launch.

Two paths, chosen per step by `make_lora_batch`:
- SGMV (prefill): a program owns a block of one segment's tokens, all with the same slot, so
  each A/B tile it loads serves up to BLOCK_M tokens through tl.dot.
- BGMV (decode): a program owns one token; the products are vector-matrix, so no dot tile
  is padded from one row to sixteen.

The slices of a merged linear (q/k/v, gate/up) are separate stacked tensors. Their addresses
and per-slice strides and widths go to the kernel through a small int64 table (cached, since
the engine allocates the stacks once), so one launch covers every slice.

Tiles are loaded in the storage dtype and computed in fp32, then cast once on store. On a
GPU, bf16/fp16 tiles upcast to fp32 are exact in tf32, so their dots use tensor cores without
losing input bits; fp32 inputs use full-precision dots to match the torch reference.
Set TRITON_INTERPRET=1 before importing this module to run it on CPU tensors (tests only).
"""

import torch
import triton
import triton.language as tl

from inference.kernels.lora_batch import LoRABatch

SGMV_BLOCK_K = 64
BGMV_BLOCK_K = 128
BLOCK_N = 64
# Shrink splits its reduction over `in` until about this many programs run: a decode step
# has a handful of (token, slice) pairs, far fewer than a GPU has SMs.
TARGET_PROGRAMS = 256
_TABLE_CACHE_SIZE = 1024
_tables: dict[tuple, torch.Tensor] = {}


@triton.jit
def _sgmv_shrink_kernel(
    x_ptr, a_table_ptr, a_ref_ptr, y_ptr,
    sorted_ids_ptr, seg_starts_ptr, seg_lens_ptr, seg_slots_ptr,
    K, R, stride_xt, stride_xk, stride_ar, stride_ak, stride_ys, stride_yt, stride_yr,
    N_SLICES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    pid_m, pid_k, pid_g = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    seg, sl = pid_g // N_SLICES, pid_g % N_SLICES
    seg_len = tl.load(seg_lens_ptr + seg)
    if pid_m * BLOCK_M >= seg_len:
        return
    slot = tl.load(seg_slots_ptr + seg)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < seg_len
    tok = tl.load(sorted_ids_ptr + tl.load(seg_starts_ptr + seg) + offs_m, mask=mask_m, other=0)
    a_ptr = tl.load(a_table_ptr + sl * 2).to(tl.pointer_type(a_ref_ptr.dtype.element_ty))
    a_ptr += slot * tl.load(a_table_ptr + sl * 2 + 1)
    offs_r = tl.arange(0, BLOCK_R)
    mask_r = offs_r < R
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for k0 in range(pid_k * BLOCK_K, K, BLOCK_K * SPLIT_K):
        kk = k0 + offs_k
        mask_k = kk < K
        x = tl.load(
            x_ptr + tok[:, None] * stride_xt + kk[None, :] * stride_xk,
            mask=mask_m[:, None] & mask_k[None, :], other=0.0,
        ).to(tl.float32)  # fmt: skip
        a = tl.load(
            a_ptr + offs_r[None, :] * stride_ar + kk[:, None] * stride_ak,
            mask=mask_k[:, None] & mask_r[None, :], other=0.0,
        ).to(tl.float32)  # fmt: skip
        acc += tl.dot(x, a, input_precision=PRECISION)
    y_ptrs = y_ptr + sl * stride_ys + tok[:, None] * stride_yt + offs_r[None, :] * stride_yr
    mask = mask_m[:, None] & mask_r[None, :]
    if SPLIT_K == 1:
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        tl.atomic_add(y_ptrs, acc, mask=mask)


@triton.jit
def _bgmv_shrink_kernel(
    x_ptr, a_table_ptr, a_ref_ptr, y_ptr, token_slots_ptr,
    K, R, stride_xt, stride_xk, stride_ar, stride_ak, stride_ys, stride_yt, stride_yr,
    BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
):  # fmt: skip
    t, pid_k, sl = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    slot = tl.load(token_slots_ptr + t)
    if slot < 0:
        return
    a_ptr = tl.load(a_table_ptr + sl * 2).to(tl.pointer_type(a_ref_ptr.dtype.element_ty))
    a_ptr += slot * tl.load(a_table_ptr + sl * 2 + 1)
    offs_r = tl.arange(0, BLOCK_R)
    mask_r = offs_r < R
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for k0 in range(pid_k * BLOCK_K, K, BLOCK_K * SPLIT_K):
        kk = k0 + offs_k
        mask_k = kk < K
        x = tl.load(x_ptr + t * stride_xt + kk * stride_xk, mask=mask_k, other=0.0)
        a = tl.load(
            a_ptr + offs_r[:, None] * stride_ar + kk[None, :] * stride_ak,
            mask=mask_r[:, None] & mask_k[None, :], other=0.0,
        ).to(tl.float32)  # fmt: skip
        acc += tl.sum(a * x.to(tl.float32)[None, :], axis=1)
    y_ptrs = y_ptr + sl * stride_ys + t * stride_yt + offs_r * stride_yr
    if SPLIT_K == 1:
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask_r)
    else:
        tl.atomic_add(y_ptrs, acc, mask=mask_r)


@triton.jit
def _sgmv_expand_kernel(
    y_ptr, b_table_ptr, b_ref_ptr, out_ptr, scales_ptr,
    sorted_ids_ptr, seg_starts_ptr, seg_lens_ptr, seg_slots_ptr,
    R, stride_ys, stride_yt, stride_yr, stride_bn, stride_br, stride_ot, stride_on,
    N_SLICES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr, ADD: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    pid_m, pid_n, pid_g = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    seg, sl = pid_g // N_SLICES, pid_g % N_SLICES
    seg_len = tl.load(seg_lens_ptr + seg)
    width = tl.load(b_table_ptr + sl * 4 + 2)
    if pid_m * BLOCK_M >= seg_len or pid_n * BLOCK_N >= width:
        return
    slot = tl.load(seg_slots_ptr + seg)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < seg_len
    tok = tl.load(sorted_ids_ptr + tl.load(seg_starts_ptr + seg) + offs_m, mask=mask_m, other=0)
    b_ptr = tl.load(b_table_ptr + sl * 4).to(tl.pointer_type(b_ref_ptr.dtype.element_ty))
    b_ptr += slot * tl.load(b_table_ptr + sl * 4 + 1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < width
    offs_r = tl.arange(0, BLOCK_R)
    mask_r = offs_r < R
    y = tl.load(
        y_ptr + sl * stride_ys + tok[:, None] * stride_yt + offs_r[None, :] * stride_yr,
        mask=mask_m[:, None] & mask_r[None, :], other=0.0,
    ).to(tl.float32)  # fmt: skip
    b = tl.load(
        b_ptr + offs_n[None, :] * stride_bn + offs_r[:, None] * stride_br,
        mask=mask_r[:, None] & mask_n[None, :], other=0.0,
    ).to(tl.float32)  # fmt: skip
    acc = tl.dot(y, b, input_precision=PRECISION) * tl.load(scales_ptr + slot).to(tl.float32)
    col = tl.load(b_table_ptr + sl * 4 + 3) + offs_n
    out_ptrs = out_ptr + tok[:, None] * stride_ot + col[None, :] * stride_on
    mask = mask_m[:, None] & mask_n[None, :]
    if ADD:
        acc += tl.load(out_ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _bgmv_expand_kernel(
    y_ptr, b_table_ptr, b_ref_ptr, out_ptr, scales_ptr, token_slots_ptr,
    R, stride_ys, stride_yt, stride_yr, stride_bn, stride_br, stride_ot, stride_on,
    BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, ADD: tl.constexpr,
):  # fmt: skip
    t, pid_n, sl = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    slot = tl.load(token_slots_ptr + t)
    width = tl.load(b_table_ptr + sl * 4 + 2)
    if slot < 0 or pid_n * BLOCK_N >= width:
        return
    b_ptr = tl.load(b_table_ptr + sl * 4).to(tl.pointer_type(b_ref_ptr.dtype.element_ty))
    b_ptr += slot * tl.load(b_table_ptr + sl * 4 + 1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < width
    offs_r = tl.arange(0, BLOCK_R)
    mask_r = offs_r < R
    y = tl.load(y_ptr + sl * stride_ys + t * stride_yt + offs_r * stride_yr, mask=mask_r, other=0.0)
    b = tl.load(
        b_ptr + offs_n[:, None] * stride_bn + offs_r[None, :] * stride_br,
        mask=mask_n[:, None] & mask_r[None, :], other=0.0,
    ).to(tl.float32)  # fmt: skip
    acc = tl.sum(b * y.to(tl.float32)[None, :], axis=1)
    acc *= tl.load(scales_ptr + slot).to(tl.float32)
    out_ptrs = out_ptr + t * stride_ot + (tl.load(b_table_ptr + sl * 4 + 3) + offs_n) * stride_on
    if ADD:
        acc += tl.load(out_ptrs, mask=mask_n, other=0.0).to(tl.float32)
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask_n)


def _runs(weights: list[torch.Tensor]) -> list[tuple[int, int]]:
    """Consecutive slices sharing inner strides; each run is one launch (usually all slices)."""
    runs, first = [], 0
    for i in range(1, len(weights) + 1):
        if i == len(weights) or weights[i].stride()[1:] != weights[first].stride()[1:]:
            runs.append((first, i))
            first = i
    return runs


def _table(rows: list[tuple[int, ...]], device: torch.device) -> torch.Tensor:
    """Device copy of per-slice (address, strides, ...) rows, cached: the stacks never move."""
    key = (device, tuple(rows))
    table = _tables.get(key)
    if table is None:
        if len(_tables) >= _TABLE_CACHE_SIZE:
            _tables.clear()
        table = _tables[key] = torch.tensor(rows, dtype=torch.int64, device=device)
    return table


def _block_r(rank: int) -> int:
    return max(16, triton.next_power_of_2(rank))  # tl.dot needs every tile dim >= 16 on a GPU


def _block_m(batch: LoRABatch) -> int:
    return min(64, max(16, triton.next_power_of_2(batch.max_seg_len)))


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
        _sgmv_shrink_kernel[(grid_m, split_k, batch.num_segments * n)](
            x, table, lora_a[0], y,
            batch.sorted_token_ids, batch.seg_starts, batch.seg_lens, batch.seg_slots,
            *strides, N_SLICES=n, BLOCK_M=_block_m(batch), BLOCK_R=block_r, BLOCK_K=block_k,
            SPLIT_K=split_k, PRECISION=_precision(x.dtype),
        )  # fmt: skip
    else:
        _bgmv_shrink_kernel[(grid_m, split_k, n)](
            x, table, lora_a[0], y, batch.token_slots,
            *strides, BLOCK_R=block_r, BLOCK_K=block_k, SPLIT_K=split_k,
        )  # fmt: skip


def add_lora(
    out: torch.Tensor,
    x: torch.Tensor,
    lora_a: list[torch.Tensor],
    lora_b: list[torch.Tensor],
    scales: torch.Tensor,
    batch: LoRABatch,
    y: torch.Tensor,
) -> None:
    """Shrink into the scratch `y`, then expand into `out`."""
    lora_shrink(x, lora_a, batch, y)
    lora_expand(y, lora_b, scales, batch, out, True)


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
        _sgmv_expand_kernel[grid](
            y, table, lora_b[0], out, scales,
            batch.sorted_token_ids, batch.seg_starts, batch.seg_lens, batch.seg_slots,
            *strides, N_SLICES=n, BLOCK_M=block_m, BLOCK_N=BLOCK_N, BLOCK_R=_block_r(rank),
            ADD=add, PRECISION=_precision(out.dtype),
        )  # fmt: skip
    else:
        _bgmv_expand_kernel[(batch.num_tokens, grid_n, n)](
            y, table, lora_b[0], out, scales, batch.token_slots,
            *strides, BLOCK_N=BLOCK_N, BLOCK_R=_block_r(rank), ADD=add,
        )  # fmt: skip
