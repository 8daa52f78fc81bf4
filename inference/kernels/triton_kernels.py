"""The Triton kernels of multi-LoRA shrink (x @ A^T) and expand (y @ B^T); lora_triton.py
chooses their grids and launches them.

- SGMV (prefill): a program owns a block of one segment's tokens, all with the same slot, so
  each A/B tile it loads serves up to BLOCK_M tokens through tl.dot.
- BGMV (decode): a program owns one token; the products are vector-matrix, so no dot tile
  is padded from one row to sixteen.

Slice `sl` of a merged linear finds its stacked weights through row `sl` of a small int64
table: (address, slot stride) for A, (address, slot stride, width, column offset) for B.
Tiles are loaded in the storage dtype and computed in fp32, then cast once on store.

Precision with bf16/fp16 weights (PRECISION "tf32"): the SGMV dots run on tf32 tensor cores.
The shrink's operands (x and A, 16-bit values upcast) are exact in tf32, and so is the
expand's B; the expand's y, the shrink's fp32 sums, is rounded to tf32 (10 mantissa bits,
2**-11 relative), below the bf16 output's own rounding (2**-9) and about one fp16 ulp of
the LoRA delta. Exact alternatives cost more than that is worth: "ieee" moves the dot to
CUDA cores, whose fp32 rate at rank 64 (128 flops per output element) is under what HBM
feeds, so these memory-bound products would become compute-bound; "tf32x3" triples the
tensor-core work and spills (228 B per thread at the 64x128 rank-16 tile on sm_80, 6 KB at
rank 64, against 20 B and none with tf32). BGMV sums in fp32 on CUDA cores (exact
operands), as do fp32 weights ("ieee"), which match the torch reference.
Set TRITON_INTERPRET=1 before importing this module to run it on CPU tensors (tests only).

The arguments are Triton values, typed by Triton when it compiles a kernel, so this module
is the one the type checker does not ask for annotations (see pyproject.toml).
"""

import triton
import triton.language as tl

from inference.kernels.triton_loads import load_tile


@triton.jit
def _slot_weights(table_ptr, ref_ptr, sl, slot, ROW: tl.constexpr):
    """Pointer to slot `slot` of slice `sl`'s stacked weights (dtype of `ref_ptr`)."""
    ptr = tl.load(table_ptr + sl * ROW).to(tl.pointer_type(ref_ptr.dtype.element_ty))
    return ptr + slot * tl.load(table_ptr + sl * ROW + 1)


@triton.jit
def _segment_slice(seg_lens_ptr, pid_g, N_SLICES: tl.constexpr):
    """The segment and slice of an SGMV program's third grid index, and the segment's length
    (a program past it returns before loading anything else)."""
    seg, sl = pid_g // N_SLICES, pid_g % N_SLICES
    return seg, sl, tl.load(seg_lens_ptr + seg)


@triton.jit
def _segment_tokens(
    sorted_ids_ptr, seg_starts_ptr, seg_slots_ptr, seg, seg_len, pid_m, BLOCK_M: tl.constexpr
):
    """Segment `seg`'s adapter slot, the token ids of this program's block of it, and which
    of them exist."""
    slot = tl.load(seg_slots_ptr + seg)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < seg_len
    tok = tl.load(sorted_ids_ptr + tl.load(seg_starts_ptr + seg) + offs_m, mask=mask_m, other=0)
    return slot, tok, mask_m


@triton.jit
def _store_sums(ptrs, acc, mask, SPLIT_K: tl.constexpr):
    """A shrink's sums; when programs split the reduction, each adds its part atomically."""
    if SPLIT_K == 1:
        tl.store(ptrs, acc.to(ptrs.dtype.element_ty), mask=mask)
    else:
        tl.atomic_add(ptrs, acc, mask=mask)


@triton.jit
def _store_out(ptrs, acc, mask, ADD: tl.constexpr):
    """An expand's result, added to what `out` holds or written over it."""
    if ADD:
        acc += tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(ptrs, acc.to(ptrs.dtype.element_ty), mask=mask)


@triton.jit
def sgmv_shrink_kernel(
    x_ptr, a_table_ptr, a_ref_ptr, y_ptr,
    sorted_ids_ptr, seg_starts_ptr, seg_lens_ptr, seg_slots_ptr,
    K, R, stride_xt, stride_xk, stride_ar, stride_ak, stride_ys, stride_yt, stride_yr,
    N_SLICES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    pid_m, pid_k, pid_g = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    seg, sl, seg_len = _segment_slice(seg_lens_ptr, pid_g, N_SLICES)
    if pid_m * BLOCK_M >= seg_len:
        return
    slot, tok, mask_m = _segment_tokens(
        sorted_ids_ptr, seg_starts_ptr, seg_slots_ptr, seg, seg_len, pid_m, BLOCK_M
    )
    a_ptr = _slot_weights(a_table_ptr, a_ref_ptr, sl, slot, 2)
    offs_r = tl.arange(0, BLOCK_R)
    mask_r = offs_r < R
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for k0 in range(pid_k * BLOCK_K, K, BLOCK_K * SPLIT_K):
        kk = k0 + offs_k
        mask_k = kk < K
        x = load_tile(x_ptr, tok, kk, stride_xt, stride_xk, mask_m, mask_k)
        a = tl.load(
            a_ptr + offs_r[None, :] * stride_ar + kk[:, None] * stride_ak,
            mask=mask_k[:, None] & mask_r[None, :], other=0.0,
        ).to(tl.float32)  # fmt: skip
        acc += tl.dot(x, a, input_precision=PRECISION)
    y_ptrs = y_ptr + sl * stride_ys + tok[:, None] * stride_yt + offs_r[None, :] * stride_yr
    _store_sums(y_ptrs, acc, mask_m[:, None] & mask_r[None, :], SPLIT_K)


@triton.jit
def bgmv_shrink_kernel(
    x_ptr, a_table_ptr, a_ref_ptr, y_ptr, token_slots_ptr,
    K, R, stride_xt, stride_xk, stride_ar, stride_ak, stride_ys, stride_yt, stride_yr,
    BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
):  # fmt: skip
    t, pid_k, sl = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    slot = tl.load(token_slots_ptr + t)
    if slot < 0:
        return
    a_ptr = _slot_weights(a_table_ptr, a_ref_ptr, sl, slot, 2)
    offs_r = tl.arange(0, BLOCK_R)
    mask_r = offs_r < R
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for k0 in range(pid_k * BLOCK_K, K, BLOCK_K * SPLIT_K):
        kk = k0 + offs_k
        mask_k = kk < K
        x = tl.load(x_ptr + t * stride_xt + kk * stride_xk, mask=mask_k, other=0.0)
        a = load_tile(a_ptr, offs_r, kk, stride_ar, stride_ak, mask_r, mask_k)
        acc += tl.sum(a * x.to(tl.float32)[None, :], axis=1)
    _store_sums(y_ptr + sl * stride_ys + t * stride_yt + offs_r * stride_yr, acc, mask_r, SPLIT_K)


@triton.jit
def sgmv_expand_kernel(
    y_ptr, b_table_ptr, b_ref_ptr, out_ptr, scales_ptr,
    sorted_ids_ptr, seg_starts_ptr, seg_lens_ptr, seg_slots_ptr,
    R, stride_ys, stride_yt, stride_yr, stride_bn, stride_br, stride_ot, stride_on,
    N_SLICES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr, ADD: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    pid_m, pid_n, pid_g = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    seg, sl, seg_len = _segment_slice(seg_lens_ptr, pid_g, N_SLICES)
    width = tl.load(b_table_ptr + sl * 4 + 2)
    if pid_m * BLOCK_M >= seg_len or pid_n * BLOCK_N >= width:
        return
    slot, tok, mask_m = _segment_tokens(
        sorted_ids_ptr, seg_starts_ptr, seg_slots_ptr, seg, seg_len, pid_m, BLOCK_M
    )
    b_ptr = _slot_weights(b_table_ptr, b_ref_ptr, sl, slot, 4)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < width
    offs_r = tl.arange(0, BLOCK_R)
    mask_r = offs_r < R
    y = load_tile(y_ptr + sl * stride_ys, tok, offs_r, stride_yt, stride_yr, mask_m, mask_r)
    b = tl.load(
        b_ptr + offs_n[None, :] * stride_bn + offs_r[:, None] * stride_br,
        mask=mask_r[:, None] & mask_n[None, :], other=0.0,
    ).to(tl.float32)  # fmt: skip
    acc = tl.dot(y, b, input_precision=PRECISION) * tl.load(scales_ptr + slot).to(tl.float32)
    col = tl.load(b_table_ptr + sl * 4 + 3) + offs_n
    out_ptrs = out_ptr + tok[:, None] * stride_ot + col[None, :] * stride_on
    _store_out(out_ptrs, acc, mask_m[:, None] & mask_n[None, :], ADD)


@triton.jit
def bgmv_expand_kernel(
    y_ptr, b_table_ptr, b_ref_ptr, out_ptr, scales_ptr, token_slots_ptr,
    R, stride_ys, stride_yt, stride_yr, stride_bn, stride_br, stride_ot, stride_on,
    BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, ADD: tl.constexpr,
):  # fmt: skip
    t, pid_n, sl = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    slot = tl.load(token_slots_ptr + t)
    width = tl.load(b_table_ptr + sl * 4 + 2)
    if slot < 0 or pid_n * BLOCK_N >= width:
        return
    b_ptr = _slot_weights(b_table_ptr, b_ref_ptr, sl, slot, 4)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < width
    offs_r = tl.arange(0, BLOCK_R)
    mask_r = offs_r < R
    y = tl.load(y_ptr + sl * stride_ys + t * stride_yt + offs_r * stride_yr, mask=mask_r, other=0.0)
    b = load_tile(b_ptr, offs_n, offs_r, stride_bn, stride_br, mask_n, mask_r)
    acc = tl.sum(b * y.to(tl.float32)[None, :], axis=1)
    acc *= tl.load(scales_ptr + slot).to(tl.float32)
    out_ptrs = out_ptr + t * stride_ot + (tl.load(b_table_ptr + sl * 4 + 3) + offs_n) * stride_on
    _store_out(out_ptrs, acc, mask_n, ADD)
