"""Paged attention on Triton: decode (one new token per sequence, split along the context
and reduced) and extend (a chunk of new tokens per sequence over its cached prefix and
causally over itself), both reading the paged KV cache in place through block tables.
This module checks the inputs and chooses tiles, split and grid; the kernels are in
paged_attention_kernels.py, the torch reference in paged_attention_ref.py.

Nothing here waits on the device or allocates by the data: launches depend on shapes only,
so a decode step can be captured in a CUDA graph (pass `scratch` and `out` from static
buffers, and a `num_splits` fixed for the graph). The kernels compile a variant per model
shape and dtype, never per step: the split count and table width are run-time values. The
caller guarantees what would cost a host sync to check: every context length fits its table
row (context_lens[i] <= max_blocks * block_size), and the table entries of a sequence's
attended blocks are valid block ids (entries behind a sliding window may be -1: they are
never read).

Set TRITON_INTERPRET=1 before importing this module to run it on CPU tensors (tests only).
"""

import torch
import triton

from inference.kernels.paged_attention_kernels import (
    paged_decode_kernel,
    paged_decode_reduce_kernel,
    paged_extend_kernel,
)

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Decode splits the context until about this many programs run (a batch of a few long
# sequences has far fewer (sequence, KV head) pairs than a GPU has SMs), but gives every
# split at least MIN_SPLIT_TOKENS tokens of the longest context a table can hold.
TARGET_PROGRAMS = 256
MIN_SPLIT_TOKENS = 256
MAX_SPLITS = 32  # also the reduce kernel's tile over splits: any count up to it, one variant
EXTEND_BLOCK_M = 64  # (token, query head) rows of an extend program
# fp32 extend dots are IEEE (no tensor cores): 64 x 64 tiles of 128-wide heads need ~30 KB
# of spilled registers per thread; 32 x 32 tiles fit
EXTEND_BLOCK_M_FP32 = 32
EXTEND_BLOCK_N_FP32 = 32


def _pow2(n: int, least: int = 16) -> int:
    return max(least, int(triton.next_power_of_2(n)))  # tl.dot needs tiles of 16 or more


def _block_n(block_d: int) -> int:
    """Tokens per K/V tile: fewer for wide heads, which would not fit in registers."""
    return 64 if block_d <= 128 else 32


def _precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"


def decode_splits(
    num_seqs: int, num_kv_heads: int, max_context: int, window: int | None = None
) -> int:
    """How many splits a decode launch uses, from static sizes only: `max_context` is the
    most tokens a table row holds (max_blocks * block_size), not any sequence's length."""
    if window is not None:
        max_context = min(max_context, window)
    by_occupancy = -(-TARGET_PROGRAMS // max(1, num_seqs * num_kv_heads))
    by_length = -(-max_context // MIN_SPLIT_TOKENS)
    return max(1, min(MAX_SPLITS, by_occupancy, by_length))


def decode_scratch(
    num_seqs: int, num_heads: int, head_dim: int, num_splits: int, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 scratch of a split decode: partial outputs [num_seqs, num_heads, num_splits,
    head_dim] and their log-sum-exps [num_seqs, num_heads, num_splits]."""
    part_out = torch.empty(num_seqs, num_heads, num_splits, head_dim, device=device)
    part_lse = torch.empty(num_seqs, num_heads, num_splits, device=device)
    return part_out, part_lse


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    *,
    window: int | None = None,
    softcap: float | None = None,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    scratch: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Attention of each sequence's one new token (q [num_seqs, num_heads, head_dim]) over
    its cached tokens, the new one included (context_lens [num_seqs], int32), through
    block_tables [num_seqs, max_blocks] (int32). Returns `out` [num_seqs, num_heads,
    head_dim]. A sequence with context length 0 (a padding row) gets zeros."""
    num_seqs, num_heads, head_dim = _check_common(q, k_cache, v_cache, block_tables, out)
    _check_index("context_lens", context_lens, (num_seqs,), q.device)
    _check_options(window, softcap)
    _, block_size, kv_heads, _ = k_cache.shape
    if num_splits is None:
        max_context = block_tables.shape[1] * block_size
        num_splits = decode_splits(num_seqs, kv_heads, max_context, window)
    if not isinstance(num_splits, int) or not 1 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits must be an int in 1..{MAX_SPLITS}, got {num_splits!r}")
    if out is None:
        out = torch.empty_like(q)
    if num_seqs == 0:
        return out
    if num_splits == 1:
        part_out, part_lse = out, out  # unused: the one split writes `out` itself
    else:
        if scratch is None:
            scratch = decode_scratch(num_seqs, num_heads, head_dim, num_splits, q.device)
        part_out, part_lse = scratch
        _check_scratch(part_out, part_lse, (num_seqs, num_heads, num_splits, head_dim), q.device)

    block_d = _pow2(head_dim)
    block_n = _block_n(block_d)
    paged_decode_kernel[(num_seqs, kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, context_lens, out, part_out, part_lse,
        float(scale), float(softcap or 1.0), int(window or 0), num_splits,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), block_tables.stride(0),
        *out.stride(), *part_out.stride()[:3], *part_lse.stride()[:2],
        HEAD_DIM=head_dim, GROUP=num_heads // kv_heads, BLOCK_SIZE=block_size,
        SPLIT=num_splits > 1, BLOCK_H=_pow2(num_heads // kv_heads), BLOCK_N=block_n,
        BLOCK_D=block_d, SLIDING=window is not None, SOFTCAP=softcap is not None,
        PRECISION=_precision(q.dtype), num_warps=4 if block_d <= 128 else 8,
    )  # fmt: skip
    if num_splits > 1:
        paged_decode_reduce_kernel[(num_seqs, num_heads)](
            part_out, part_lse, out, num_splits,
            *part_out.stride()[:3], *part_lse.stride()[:2], *out.stride(),
            HEAD_DIM=head_dim, BLOCK_S=MAX_SPLITS, BLOCK_D=block_d,
        )  # fmt: skip
    return out


def paged_extend(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_starts: torch.Tensor,
    scale: float,
    *,
    window: int | None = None,
    softcap: float | None = None,
    max_query_len: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of prefill chunks, laid back to back in q [num_tokens, num_heads,
    head_dim]: sequence i's tokens are cu_seqlens_q[i]:cu_seqlens_q[i+1] (int32), at
    positions from context_starts[i] (int32; 0 when nothing is cached) on, and attend to
    the sequence's tokens before them and to each other, all read from the cache through
    block_tables [num_seqs, max_blocks] (int32). `max_query_len` must be at least the
    longest chunk (tokens past it are not computed); the default, all of q, launches idle
    programs but needs no host sync."""
    num_tokens, num_heads, head_dim = _check_common(q, k_cache, v_cache, block_tables, out)
    num_seqs = block_tables.shape[0]
    _check_index("cu_seqlens_q", cu_seqlens_q, (num_seqs + 1,), q.device)
    _check_index("context_starts", context_starts, (num_seqs,), q.device)
    _check_options(window, softcap)
    if max_query_len is None:
        max_query_len = num_tokens
    if not isinstance(max_query_len, int) or max_query_len < 0:
        raise ValueError(f"max_query_len must be an int >= 0, got {max_query_len!r}")
    if out is None:
        out = torch.empty_like(q)
    if num_seqs == 0 or num_tokens == 0 or max_query_len == 0:
        return out

    _, block_size, kv_heads, _ = k_cache.shape
    group = num_heads // kv_heads
    fp32 = q.dtype == torch.float32
    block_m = max(EXTEND_BLOCK_M_FP32 if fp32 else EXTEND_BLOCK_M, _pow2(group))
    block_q = block_m // group
    block_d = _pow2(head_dim)
    block_n = min(EXTEND_BLOCK_N_FP32, _block_n(block_d)) if fp32 else _block_n(block_d)
    paged_extend_kernel[(triton.cdiv(max_query_len, block_q), num_seqs, kv_heads)](
        q, k_cache, v_cache, block_tables, cu_seqlens_q, context_starts, out,
        float(scale), float(softcap or 1.0), int(window or 0),
        *q.stride(), *k_cache.stride(), *v_cache.stride(), block_tables.stride(0),
        *out.stride(),
        HEAD_DIM=head_dim, GROUP=group, BLOCK_SIZE=block_size, BLOCK_M=block_m,
        BLOCK_Q=block_q, BLOCK_N=block_n, BLOCK_D=block_d,
        SLIDING=window is not None, SOFTCAP=softcap is not None,
        PRECISION=_precision(q.dtype), num_warps=4 if block_d <= 128 else 8,
    )  # fmt: skip
    return out


def _check_common(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    out: torch.Tensor | None,
) -> tuple[int, int, int]:
    """Shapes, dtypes and devices both kernels need; returns q's three sizes."""
    if q.dim() != 3:
        raise ValueError(f"q must be [tokens, num_heads, head_dim], got shape {tuple(q.shape)}")
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        raise ValueError(
            "k_cache and v_cache must both be [num_blocks, block_size, kv_heads, head_dim], "
            f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    tokens, num_heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"q has head_dim {head_dim}, the cache {k_cache.shape[3]}")
    if kv_heads == 0 or num_heads % kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of kv_heads ({kv_heads})")
    if q.dtype not in DTYPES or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(
            f"q, k_cache and v_cache must share one dtype of {DTYPES}, got {q.dtype}, "
            f"{k_cache.dtype} and {v_cache.dtype}"
        )
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}")
    if block_tables.dim() != 2 or block_tables.dtype != torch.int32:
        raise ValueError(
            "block_tables must be an int32 [num_seqs, max_blocks] tensor, got "
            f"{block_tables.dtype} of shape {tuple(block_tables.shape)}"
        )
    if block_tables.device != q.device or block_tables.stride(1) != 1:
        raise ValueError("block_tables must be on q's device with contiguous rows")
    if out is not None and (out.shape != q.shape or out.dtype != q.dtype or out.device != q.device):
        raise ValueError(
            f"out must match q ({tuple(q.shape)}, {q.dtype}, {q.device}), got "
            f"{tuple(out.shape)}, {out.dtype}, {out.device}"
        )
    return tokens, num_heads, head_dim


def _check_index(name: str, t: torch.Tensor, shape: tuple[int, ...], device: torch.device) -> None:
    if t.dtype != torch.int32 or tuple(t.shape) != shape or t.device != device:
        raise ValueError(
            f"{name} must be an int32 tensor of shape {shape} on {device}, got {t.dtype} of "
            f"shape {tuple(t.shape)} on {t.device}"
        )
    if t.stride(0) != 1:
        raise ValueError(f"{name} must be contiguous")


def _check_options(window: int | None, softcap: float | None) -> None:
    if window is not None and (not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be a positive int or None, got {window!r}")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap must be > 0 or None, got {softcap!r}")


def _check_scratch(
    part_out: torch.Tensor,
    part_lse: torch.Tensor,
    shape: tuple[int, int, int, int],
    device: torch.device,
) -> None:
    """Scratch as decode_scratch makes it: fp32, this shape, a contiguous last dim."""
    for name, t, want in (("part_out", part_out, shape), ("part_lse", part_lse, shape[:3])):
        if (
            t.dtype != torch.float32
            or tuple(t.shape) != want
            or t.device != device
            or t.stride(-1) != 1
        ):
            raise ValueError(
                f"scratch {name} must be a float32 tensor of shape {want} on {device} with a "
                f"contiguous last dim (see decode_scratch), got {t.dtype} of shape "
                f"{tuple(t.shape)} on {t.device}"
            )
