# mypy: disallow-untyped-defs=False, disallow-incomplete-defs=False
# mypy: disallow-untyped-decorators=False
"""The Triton kernels of paged attention; paged_attention.py checks the inputs, chooses the
tiles and the split, and launches them.

Keys and values are read in place from the cache, [num_blocks, block_size, kv_heads,
head_dim] per layer: token t of a sequence is row t % block_size of block
table[t // block_size]. A tile of BLOCK_N consecutive tokens looks up each token's block,
so a tile may span blocks, and a token outside the range a program attends to is neither
looked up nor loaded: blocks behind a sliding window (table entry -1) are never touched.

- Decode: a program owns one sequence, one KV head and one split of the context; its rows
  are the query heads of that KV head (GQA), so each K/V tile serves all of them. With more
  than one split, each writes its normalised partial output and log-sum-exp to scratch and
  the reduce kernel merges them (flash-decoding). How many splits is a run-time value
  (only whether there are several is compiled in), so steps of any batch size or table
  width reuse the variants compiled at start-up.
- Extend (chunked prefill): a program owns a block of one sequence's new tokens for one KV
  head; its rows are (token, query head) pairs, token-major. The tokens attend causally to
  the sequence's cached prefix and to each other, all read from the cache (the layer has
  stored the chunk's own keys and values before attending).

Tiles are loaded in the storage dtype and computed in fp32: scores, softmax and both
dots. On a GPU, bf16/fp16 tiles upcast to fp32 are exact in tf32, so Q @ K^T loses nothing
on tensor cores and P @ V rounds the probabilities to tf32 (finer than the bf16 the torch
path rounds them to); fp32 inputs use IEEE dots, to match the reference to 1e-5.
Set TRITON_INTERPRET=1 before importing this module to run it on CPU tensors (tests only).

The arguments are Triton values, typed by Triton when it compiles a kernel, so this module
is one the type checker does not ask for annotations (the comments on lines 1-2).
"""

import triton
import triton.language as tl

from inference.kernels.triton_loads import load_tile


@triton.jit
def _tanh(x):
    """tanh in fp32 from exp only (Triton's interpreter has no libdevice): a Taylor series
    near zero, where (1 - e^-2|x|) / (1 + e^-2|x|) would cancel, the closed form beyond."""
    x2 = x * x
    series = 62.0 / 2835 + x2 * (-1382.0 / 155925)  # Horner, innermost (x^11) term first
    series = -17.0 / 315 + x2 * series
    series = 2.0 / 15 + x2 * series
    series = -1.0 / 3 + x2 * series
    series = x * (1.0 + x2 * series)
    e = tl.exp(-2.0 * tl.abs(x))
    closed = (1.0 - e) / (1.0 + e)
    closed = tl.where(x < 0, -closed, closed)
    return tl.where(tl.abs(x) < 0.25, series, closed)


@triton.jit
def _kv_tile(
    cache_ptr, table_ptr, keys, valid, kvh, offs_d, mask_d,
    stride_b, stride_t, stride_h, stride_d, BLOCK_SIZE: tl.constexpr, KEYS_LAST: tl.constexpr,
):  # fmt: skip
    """The cached rows of tokens `keys` for KV head `kvh`: [BLOCK_D, BLOCK_N] when KEYS_LAST
    (keys, for Q @ K^T), else [BLOCK_N, BLOCK_D] (values). Tokens not `valid` are neither
    looked up in the block table nor loaded."""
    block = tl.load(table_ptr + keys // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
    row = block * stride_b + (keys % BLOCK_SIZE) * stride_t + kvh * stride_h
    if KEYS_LAST:
        tile = tl.load(
            cache_ptr + row[None, :] + offs_d[:, None] * stride_d,
            mask=mask_d[:, None] & valid[None, :], other=0.0,
        )  # fmt: skip
    else:
        tile = tl.load(
            cache_ptr + row[:, None] + offs_d[None, :] * stride_d,
            mask=valid[:, None] & mask_d[None, :], other=0.0,
        )  # fmt: skip
    return tile.to(tl.float32)


@triton.jit
def _scores(q, k, scale, softcap, SOFTCAP: tl.constexpr, PRECISION: tl.constexpr):
    """q k^T * scale in fp32, soft-capped (Gemma 2: cap * tanh(s / cap)) when SOFTCAP."""
    s = tl.dot(q, k, input_precision=PRECISION) * scale
    if SOFTCAP:
        s = softcap * _tanh(s / softcap)
    return s


@triton.jit
def _softmax_step(s, visible, v, m_i, l_i, acc, PRECISION: tl.constexpr):
    """One tile of the online softmax. A row that has seen no visible key yet keeps its
    maximum at -inf; it is shifted by 0 instead, so no -inf - -inf makes a NaN."""
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp(s - m_safe[:, None])
    alpha = tl.exp(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit
def _normalised(acc, l_i):
    """acc / l per row, 0 for a row that attended to nothing (an empty split or sequence)."""
    return acc / tl.where(l_i > 0, l_i, 1.0)[:, None]


@triton.jit
def _visible(keys, valid, query_pos, window, CAUSAL: tl.constexpr, SLIDING: tl.constexpr):
    """Which of a tile's scores count. Decode's key range holds only keys its query sees;
    extend's rows (CAUSAL) each see the keys up to their own position, within the window."""
    visible = valid[None, :]
    if CAUSAL:
        visible = visible & (keys[None, :] <= query_pos[:, None])
        if SLIDING:
            visible = visible & (keys[None, :] > query_pos[:, None] - window)
    return visible


@triton.jit
def _attend(
    q, k_cache_ptr, v_cache_ptr, table_ptr, kvh, offs_d, mask_d, lo, hi, query_pos, window,
    scale, softcap,
    stride_kb, stride_kt, stride_kh, stride_kd, stride_vb, stride_vt, stride_vh, stride_vd,
    ROWS: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr, SLIDING: tl.constexpr, SOFTCAP: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """q's rows over the cached keys [lo, hi) of KV head `kvh`, one K/V tile at a time: each
    row's running maximum, sum and unnormalised output (see _normalised)."""
    m_i = tl.full((ROWS,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((ROWS,), dtype=tl.float32)
    acc = tl.zeros((ROWS, BLOCK_D), dtype=tl.float32)
    for n0 in range(lo, hi, BLOCK_N):
        keys = n0 + tl.arange(0, BLOCK_N)
        valid = keys < hi
        k = _kv_tile(
            k_cache_ptr, table_ptr, keys, valid, kvh, offs_d, mask_d,
            stride_kb, stride_kt, stride_kh, stride_kd, BLOCK_SIZE, True,
        )  # fmt: skip
        s = _scores(q, k, scale, softcap, SOFTCAP, PRECISION)
        visible = _visible(keys, valid, query_pos, window, CAUSAL, SLIDING)
        v = _kv_tile(
            v_cache_ptr, table_ptr, keys, valid, kvh, offs_d, mask_d,
            stride_vb, stride_vt, stride_vh, stride_vd, BLOCK_SIZE, False,
        )  # fmt: skip
        m_i, l_i, acc = _softmax_step(s, visible, v, m_i, l_i, acc, PRECISION)
    return m_i, l_i, acc


@triton.jit
def _split_range(context_len, window, split, num_splits, BLOCK_N: tl.constexpr,
                 SLIDING: tl.constexpr):  # fmt: skip
    """Keys [start, end) of one decode split. The query (position context_len - 1) sees keys
    [lo, context_len); each split takes an equal share of them, whole tiles, so short
    sequences leave the last splits empty."""
    lo = 0
    if SLIDING:
        lo = tl.maximum(context_len - window, 0)
    share = tl.cdiv(tl.cdiv(context_len - lo, num_splits), BLOCK_N) * BLOCK_N
    start = lo + split * share
    end = tl.minimum(start + share, context_len)
    return start, end


# Arguments whose values change from step to step (the split count, the table width and the
# scratch strides that follow them) are not specialised on: a new value must never mean a
# new variant compiled while serving.
_DECODE_RUNTIME = ("num_splits", "stride_bs", "stride_ps", "stride_ph", "stride_pk",
                   "stride_ls", "stride_lh")  # fmt: skip


@triton.jit(do_not_specialize=_DECODE_RUNTIME)
def paged_decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr,
    out_ptr, part_out_ptr, part_lse_ptr, scale, softcap, window, num_splits,
    stride_qs, stride_qh, stride_qd,
    stride_kb, stride_kt, stride_kh, stride_kd,
    stride_vb, stride_vt, stride_vh, stride_vd,
    stride_bs, stride_os, stride_oh, stride_od,
    stride_ps, stride_ph, stride_pk, stride_ls, stride_lh,
    HEAD_DIM: tl.constexpr, GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    SPLIT: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, SLIDING: tl.constexpr, SOFTCAP: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    seq, kvh, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    context_len = tl.load(context_lens_ptr + seq)
    offs_h = tl.arange(0, BLOCK_H)
    mask_h = offs_h < GROUP
    heads = kvh * GROUP + offs_h
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    q = load_tile(q_ptr + seq * stride_qs, heads, offs_d, stride_qh, stride_qd, mask_h, mask_d)

    start, end = _split_range(context_len, window, split, num_splits, BLOCK_N, SLIDING)
    m_i, l_i, acc = _attend(
        q, k_cache_ptr, v_cache_ptr, block_tables_ptr + seq * stride_bs, kvh, offs_d, mask_d,
        start, end, context_len - 1, window, scale, softcap,
        stride_kb, stride_kt, stride_kh, stride_kd, stride_vb, stride_vt, stride_vh, stride_vd,
        BLOCK_H, BLOCK_SIZE, BLOCK_N, BLOCK_D, False, SLIDING, SOFTCAP, PRECISION,
    )  # fmt: skip

    out = _normalised(acc, l_i)
    mask_hd = mask_h[:, None] & mask_d[None, :]
    if not SPLIT:
        out_ptrs = (
            out_ptr + seq * stride_os + heads[:, None] * stride_oh + offs_d[None, :] * stride_od
        )
        tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=mask_hd)
    else:
        part_ptrs = (
            part_out_ptr + seq * stride_ps + heads[:, None] * stride_ph + split * stride_pk
            + offs_d[None, :]
        )  # fmt: skip
        tl.store(part_ptrs, out, mask=mask_hd)
        lse = tl.where(l_i > 0, m_i + tl.log(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
        tl.store(part_lse_ptr + seq * stride_ls + heads * stride_lh + split, lse, mask=mask_h)


@triton.jit(do_not_specialize=_DECODE_RUNTIME)
def paged_decode_reduce_kernel(
    part_out_ptr, part_lse_ptr, out_ptr, num_splits,
    stride_ps, stride_ph, stride_pk, stride_ls, stride_lh, stride_os, stride_oh, stride_od,
    HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Merges one (sequence, head)'s splits, each weighted by exp(its log-sum-exp)."""
    seq, head = tl.program_id(0), tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    mask_s = offs_s < num_splits
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    lse = tl.load(
        part_lse_ptr + seq * stride_ls + head * stride_lh + offs_s, mask=mask_s, other=float("-inf")
    )
    top = tl.max(lse, 0)
    weights = tl.exp(lse - tl.where(top == float("-inf"), 0.0, top))
    parts = tl.load(
        part_out_ptr + seq * stride_ps + head * stride_ph + offs_s[:, None] * stride_pk
        + offs_d[None, :],
        mask=mask_s[:, None] & mask_d[None, :], other=0.0,
    )  # fmt: skip
    total = tl.sum(weights, 0)
    out = tl.sum(weights[:, None] * parts, 0) / tl.where(total > 0, total, 1.0)
    out_ptrs = out_ptr + seq * stride_os + head * stride_oh + offs_d * stride_od
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=mask_d)


@triton.jit(do_not_specialize=("stride_bs",))  # the table width changes per step
def paged_extend_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, cu_seqlens_ptr, context_starts_ptr,
    out_ptr, scale, softcap, window,
    stride_qt, stride_qh, stride_qd,
    stride_kb, stride_kt, stride_kh, stride_kd,
    stride_vb, stride_vt, stride_vh, stride_vd,
    stride_bs, stride_ot, stride_oh, stride_od,
    HEAD_DIM: tl.constexpr, GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, SLIDING: tl.constexpr, SOFTCAP: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    q_block, seq, kvh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    q_begin = tl.load(cu_seqlens_ptr + seq)
    q_len = tl.load(cu_seqlens_ptr + seq + 1) - q_begin
    q0 = q_block * BLOCK_Q
    if q0 >= q_len:
        return
    context_start = tl.load(context_starts_ptr + seq)

    # Row r is query head kvh * GROUP + r % GROUP of the chunk's token q0 + r // GROUP.
    rows = tl.arange(0, BLOCK_M)
    tok = q0 + rows // GROUP
    heads = kvh * GROUP + rows % GROUP
    mask_m = (rows < BLOCK_Q * GROUP) & (tok < q_len)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    mask_md = mask_m[:, None] & mask_d[None, :]
    q = tl.load(
        q_ptr + (q_begin + tok)[:, None] * stride_qt + heads[:, None] * stride_qh
        + offs_d[None, :] * stride_qd,
        mask=mask_md, other=0.0,
    ).to(tl.float32)  # fmt: skip
    query_pos = context_start + tok

    # The block's queries see keys [lo, hi): from the first one's window to the last one.
    hi = context_start + tl.minimum(q0 + BLOCK_Q, q_len)
    lo = 0
    if SLIDING:
        lo = tl.maximum(context_start + q0 - window + 1, 0)
    m_i, l_i, acc = _attend(
        q, k_cache_ptr, v_cache_ptr, block_tables_ptr + seq * stride_bs, kvh, offs_d, mask_d,
        lo, hi, query_pos, window, scale, softcap,
        stride_kb, stride_kt, stride_kh, stride_kd, stride_vb, stride_vt, stride_vh, stride_vd,
        BLOCK_M, BLOCK_SIZE, BLOCK_N, BLOCK_D, True, SLIDING, SOFTCAP, PRECISION,
    )  # fmt: skip

    out_ptrs = (
        out_ptr + (q_begin + tok)[:, None] * stride_ot + heads[:, None] * stride_oh
        + offs_d[None, :] * stride_od
    )  # fmt: skip
    tl.store(out_ptrs, _normalised(acc, l_i).to(out_ptr.dtype.element_ty), mask=mask_md)
