# mypy: disallow-untyped-defs=False, disallow-incomplete-defs=False
# mypy: disallow-untyped-decorators=False
"""The Triton kernels of the quantized-weight GEMMs; quant_triton.py chooses their tiles and
grids and launches them (quant_ref.py is what they compute).

- Packed integers: a program owns a [BLOCK_M, BLOCK_N] tile of the output and walks K,
  unpacking each weight tile from its int32 words in registers. When a K tile lies in one
  group (no activation order, group size a multiple of BLOCK_K, or one group per row), the
  dot runs on the integers less their zero point (exact in any precision: |q - z| < 256)
  and the group's scale multiplies the tile's partial sum; otherwise each element is
  scaled before the dot.
- FP8: activations are quantized per row by a small kernel (amax / 448, or a stored
  per-tensor scale), then a GEMM with fp8 operands on sm_89+ tensor cores, the two scales
  applied to the fp32 sums. The weight-only form (sm_80, no fp8 tensor cores) reads the
  e4m3 bytes as uint8 and decodes them with integer operations, which any target compiles.

Tiles are computed in fp32 (bf16 maths is also wrong in Triton's interpreter); with 16-bit
activations the dots are tf32 (PRECISION), exact for bf16/fp16 operands and for small
integers, so only per-element-scaled weights round (to 2**-11 relative).
Set TRITON_INTERPRET=1 before importing this module to run it on CPU tensors (tests only).
The arguments are Triton values, so the type checker asks for no annotations here (the
comments on lines 1-2).
"""

import triton
import triton.language as tl

from inference.kernels.triton_loads import load_tile

FP8_MAX = tl.constexpr(448.0)
# A step's token count: one compiled variant for any count (the wrapper's tile buckets
# are the variants), as CUDA graphs and prefill chunks change it every step
_ROWS = ("M",)


@triton.jit
def _unpacked_weights(qw_ptr, offs_n, kk, stride_qn, stride_qk, mask_n, mask_k,
                      BITS: tl.constexpr):  # fmt: skip
    """[len(kk), len(offs_n)] stored (unsigned) values of the packed weight, int32."""
    PACK: tl.constexpr = 32 // BITS
    words = tl.load(
        qw_ptr + offs_n[None, :] * stride_qn + (kk // PACK)[:, None] * stride_qk,
        mask=mask_k[:, None] & mask_n[None, :], other=0,
    )  # fmt: skip
    return (words >> ((kk % PACK) * BITS)[:, None]) & ((1 << BITS) - 1)


@triton.jit
def _zero_points(zero_ptr, offs_n, groups, stride_zn, stride_zg, mask, BITS: tl.constexpr):
    """Stored zero points of outputs `offs_n` at `groups` (same shape as their broadcast):
    packed along the output dimension."""
    PACK: tl.constexpr = 32 // BITS
    words = tl.load(zero_ptr + (offs_n // PACK) * stride_zn + groups * stride_zg, mask=mask,
                    other=0)  # fmt: skip
    return (words >> ((offs_n % PACK) * BITS)) & ((1 << BITS) - 1)


@triton.jit(do_not_specialize=_ROWS)
def int_weight_gemm_kernel(
    x_ptr, qw_ptr, scale_ptr, zero_ptr, gidx_ptr, out_ptr,
    M, N, K, group_size,
    stride_xm, stride_xk, stride_qn, stride_qk, stride_sn, stride_sg, stride_zn, stride_zg,
    stride_om, stride_on,
    BITS: tl.constexpr, HAS_ZERO: tl.constexpr, HAS_GIDX: tl.constexpr,
    TILE_GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m, mask_n = offs_m < M, offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    offset = 1 << (BITS - 1)  # the stored value of q = 0
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        mask_k = kk < K
        x = load_tile(x_ptr, offs_m, kk, stride_xm, stride_xk, mask_m, mask_k)
        q = _unpacked_weights(qw_ptr, offs_n, kk, stride_qn, stride_qk, mask_n, mask_k, BITS)
        if TILE_GROUP:
            g = k0 // group_size
            if HAS_ZERO:
                zero = _zero_points(zero_ptr, offs_n, g, stride_zn, stride_zg, mask_n, BITS)
                w = (q - zero[None, :]).to(tl.float32)
            else:
                w = (q - offset).to(tl.float32)
            s = tl.load(scale_ptr + offs_n * stride_sn + g * stride_sg, mask=mask_n, other=0.0)
            acc += tl.dot(x, w, input_precision=PRECISION) * s.to(tl.float32)[None, :]
        else:
            g = tl.load(gidx_ptr + kk, mask=mask_k, other=0) if HAS_GIDX else kk // group_size
            mask = mask_k[:, None] & mask_n[None, :]
            if HAS_ZERO:
                zero = _zero_points(zero_ptr, offs_n[None, :], g[:, None], stride_zn, stride_zg,
                                    mask, BITS)  # fmt: skip
                w = (q - zero).to(tl.float32)
            else:
                w = (q - offset).to(tl.float32)
            s = tl.load(scale_ptr + offs_n[None, :] * stride_sn + g[:, None] * stride_sg,
                        mask=mask, other=0.0)  # fmt: skip
            acc += tl.dot(x, w * s.to(tl.float32), input_precision=PRECISION)
    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _round_to_e4m3(v):
    """v (|v| <= 448) rounded to the nearest e4m3 value, ties to even, still fp32: the cast
    that follows is then exact (Triton's interpreter rounds a value just below a power of
    two wrongly). Normal range: keep 3 mantissa bits (the carry may bump the exponent);
    below 2**-6 the steps are 2**-9, the spacing of fp32 in [2**14, 2**15)."""
    bits = v.to(tl.int32, bitcast=True)
    kept = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576  # clear the 20 low bits
    small = (v + 24576.0) - 24576.0
    return tl.where(tl.abs(v) < 0.015625, small, kept.to(tl.float32, bitcast=True))


@triton.jit
def fp8_quantize_rows_kernel(
    x_ptr, xq_ptr, xs_ptr, input_scale_ptr, K,
    stride_xm, stride_xk, stride_qm, stride_qk,
    STATIC: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Row m of x in e4m3 and its scale: amax / 448 (dynamic) or the stored input scale."""
    m = tl.program_id(0)
    offs_k = tl.arange(0, BLOCK_K)
    if STATIC:
        scale = tl.load(input_scale_ptr).to(tl.float32)
    else:
        amax = tl.zeros((BLOCK_K,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + offs_k
            x = tl.load(x_ptr + m * stride_xm + kk * stride_xk, mask=kk < K, other=0.0)
            amax = tl.maximum(amax, tl.abs(x.to(tl.float32)))
        scale = tl.max(amax, axis=0) / FP8_MAX
        scale = tl.where(scale == 0.0, 1.1920928955078125e-07, scale)  # fp32 eps
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        x = tl.load(x_ptr + m * stride_xm + kk * stride_xk, mask=kk < K, other=0.0)
        xq = _round_to_e4m3(tl.clamp(x.to(tl.float32) / scale, -FP8_MAX, FP8_MAX))
        tl.store(xq_ptr + m * stride_qm + kk * stride_qk, xq.to(xq_ptr.dtype.element_ty),
                 mask=kk < K)  # fmt: skip
    tl.store(xs_ptr + m, scale)


@triton.jit
def _scaled_out(out_ptr, acc, ws_ptr, offs_m, offs_n, mask_m, mask_n, stride_om, stride_on,
                WS_PER_CHANNEL: tl.constexpr):  # fmt: skip
    """Store acc times the weight's scale (per output channel or one for the tensor)."""
    if WS_PER_CHANNEL:
        acc *= tl.load(ws_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    else:
        acc *= tl.load(ws_ptr).to(tl.float32)
    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit(do_not_specialize=_ROWS)
def fp8_gemm_kernel(
    xq_ptr, xs_ptr, w_ptr, ws_ptr, out_ptr, M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_om, stride_on,
    WS_PER_CHANNEL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    """(xq * xs) @ (w * ws)^T: xq e4m3 [M, K] with a scale per row, w e4m3 [N, K]."""
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m, mask_n = offs_m < M, offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        mask_k = kk < K
        x = tl.load(xq_ptr + offs_m[:, None] * stride_xm + kk[None, :] * stride_xk,
                    mask=mask_m[:, None] & mask_k[None, :], other=0.0)  # fmt: skip
        w = tl.load(w_ptr + offs_n[None, :] * stride_wn + kk[:, None] * stride_wk,
                    mask=mask_k[:, None] & mask_n[None, :], other=0.0)  # fmt: skip
        acc = tl.dot(x, w, acc)
    acc *= tl.load(xs_ptr + offs_m, mask=mask_m, other=0.0)[:, None]
    _scaled_out(out_ptr, acc, ws_ptr, offs_m, offs_n, mask_m, mask_n, stride_om, stride_on,
                WS_PER_CHANNEL)  # fmt: skip


@triton.jit
def _e4m3_to_fp32(b):
    """Decode e4m3fn bytes (uint8 loaded as int32) exactly, with integer operations only."""
    exponent = (b >> 3) & 15
    mantissa = b & 7
    normal = (((exponent + 120) << 23) | (mantissa << 20)).to(tl.float32, bitcast=True)
    magnitude = tl.where(exponent == 0, mantissa.to(tl.float32) * 0.001953125, normal)  # 2**-9
    return tl.where((b & 128) != 0, -magnitude, magnitude)


@triton.jit(do_not_specialize=_ROWS)
def fp8_weight_only_gemm_kernel(
    x_ptr, w_ptr, ws_ptr, out_ptr, M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_om, stride_on,
    WS_PER_CHANNEL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """x @ (w * ws)^T: x in its own dtype, w the e4m3 bytes [N, K] viewed as uint8."""
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m, mask_n = offs_m < M, offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        mask_k = kk < K
        x = load_tile(x_ptr, offs_m, kk, stride_xm, stride_xk, mask_m, mask_k)
        b = tl.load(w_ptr + offs_n[None, :] * stride_wn + kk[:, None] * stride_wk,
                    mask=mask_k[:, None] & mask_n[None, :], other=0)  # fmt: skip
        acc += tl.dot(x, _e4m3_to_fp32(b.to(tl.int32)), input_precision=PRECISION)
    _scaled_out(out_ptr, acc, ws_ptr, offs_m, offs_n, mask_m, mask_n, stride_om, stride_on,
                WS_PER_CHANNEL)  # fmt: skip
