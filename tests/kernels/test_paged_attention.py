"""The paged attention kernels, run by Triton's interpreter on CPU, against the torch
reference (itself checked against the engine's attention once, below).

The interpreter is slow and gets bf16 casts wrong (it truncates where a GPU rounds), so
shapes stay small and the exact comparisons are in fp32. Every block table is shuffled, and
the window cases prove that nothing outside a sequence's attended tokens is read: every
cache row a query does not see is NaN, and table entries past a sequence's end or wholly
behind its window are -1 (or point at a NaN block).
"""

from typing import NamedTuple

import pytest
import torch

from inference.engine.model.attention import attend, causal_mask
from inference.kernels.paged_attention import (
    decode_scratch,
    decode_splits,
    paged_decode,
    paged_extend,
)
from inference.kernels.paged_attention_ref import ref_paged_decode, ref_paged_extend

ATOL = RTOL = 1e-5


class Shape(NamedTuple):
    block_size: int = 4
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 32
    window: int | None = None
    softcap: float | None = None
    scale: float | None = None  # None: head_dim ** -0.5


class Paged(NamedTuple):
    """A cache, shuffled tables and the cache as a query must find it (clean) beside one
    where everything it must not read is NaN or -1 (poisoned)."""

    k: torch.Tensor
    v: torch.Tensor
    tables: torch.Tensor
    poisoned_k: torch.Tensor
    poisoned_v: torch.Tensor
    poisoned_tables: torch.Tensor


def paged_cache(
    shape: Shape,
    lengths: list[int],
    first_seen: list[int],
    dtype: torch.dtype = torch.float32,
    released: str = "-1",
) -> Paged:
    """Sequence i holds `lengths[i]` tokens in private blocks, in shuffled order, and reads
    only tokens first_seen[i]..lengths[i]-1. In the poisoned copy, the other rows of its
    blocks are NaN, its table is -1 past its last block, and blocks wholly before
    first_seen[i] are released: -1, or (released="nan-block") a block that is all NaN."""
    bs = shape.block_size
    counts = [-(-n // bs) for n in lengths]
    num_blocks = sum(counts) + 1  # the last one is the NaN block
    ids = torch.randperm(num_blocks - 1).tolist()
    width = max(counts + [1])
    tables = torch.zeros(len(lengths), width, dtype=torch.int32)
    poisoned_tables = torch.full_like(tables, -1)
    dims = (num_blocks, bs, shape.kv_heads, shape.head_dim)
    k, v = torch.randn(dims).to(dtype), torch.randn(dims).to(dtype)
    pk, pv = k.clone(), v.clone()
    pk[-1] = pv[-1] = float("nan")
    for i, (n, first) in enumerate(zip(lengths, first_seen, strict=True)):
        own = [ids.pop() for _ in range(counts[i])]
        tables[i, : len(own)] = poisoned_tables[i, : len(own)] = torch.tensor(own)
        for pos in [*range(first), *range(n, len(own) * bs)]:
            pk[own[pos // bs], pos % bs] = pv[own[pos // bs], pos % bs] = float("nan")
        behind = first // bs  # as block_manager.release_behind_window counts them
        poisoned_tables[i, :behind] = -1 if released == "-1" else num_blocks - 1
    return Paged(k, v, tables, pk, pv, poisoned_tables)


def _scale(shape: Shape) -> float:
    return shape.head_dim**-0.5 if shape.scale is None else shape.scale


# --- decode ------------------------------------------------------------------------------

DECODE_CASES = {
    # name: (shape, context lengths, splits)
    "bs4-mha": (Shape(heads=2, kv_heads=2), [1, 4, 7, 12, 5], 1),
    "bs16-gqa2-3-splits": (Shape(16, head_dim=64), [200, 37, 64, 129], 3),
    "bs16-gqa4-4-splits": (Shape(16, heads=8), [300, 16, 257], 4),
    "bs32-2-splits": (Shape(32), [96, 33, 160], 2),
    "head-dim-80-gqa4": (Shape(16, kv_heads=1, head_dim=80), [70, 5], 2),
    "softcap-and-scale": (Shape(softcap=3.0, scale=0.5), [50, 3], 1),
    "window": (Shape(window=20), [150, 9, 30, 21], 2),
    "window-softcap-3-splits": (Shape(16, window=100, softcap=10.0), [300, 40], 3),
    "padding-row": (Shape(), [0, 20], 2),
}


def _decode_inputs(
    shape: Shape, lengths: list[int], dtype: torch.dtype = torch.float32, released: str = "-1"
) -> tuple[torch.Tensor, Paged]:
    window = shape.window
    first_seen = [0 if window is None else max(0, n - window) for n in lengths]
    q = torch.randn(len(lengths), shape.heads, shape.head_dim)
    return q, paged_cache(shape, lengths, first_seen, dtype, released)


def _decode(q, k, v, tables, lengths, shape, **kw):
    return paged_decode(
        q, k, v, tables, torch.tensor(lengths, dtype=torch.int32), _scale(shape),
        window=shape.window, softcap=shape.softcap, **kw,
    )  # fmt: skip


def _decode_ref(q, paged, lengths, shape):
    return ref_paged_decode(
        q, paged.k, paged.v, paged.tables, torch.tensor(lengths), _scale(shape),
        window=shape.window, softcap=shape.softcap,
    )  # fmt: skip


@pytest.mark.parametrize("case", DECODE_CASES)
def test_decode_matches_reference(case):
    shape, lengths, splits = DECODE_CASES[case]
    q, paged = _decode_inputs(shape, lengths)
    out = _decode(q, paged.k, paged.v, paged.tables, lengths, shape, num_splits=splits)
    torch.testing.assert_close(out, _decode_ref(q, paged, lengths, shape), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("case", DECODE_CASES)
@pytest.mark.parametrize("released", ["-1", "nan-block"])
def test_decode_reads_nothing_a_query_does_not_see(case, released):
    shape, lengths, splits = DECODE_CASES[case]
    q, paged = _decode_inputs(shape, lengths, released=released)
    out = _decode(
        q, paged.poisoned_k, paged.poisoned_v, paged.poisoned_tables, lengths, shape,
        num_splits=splits,
    )  # fmt: skip
    torch.testing.assert_close(out, _decode_ref(q, paged, lengths, shape), atol=ATOL, rtol=RTOL)


def test_decode_splits_merge_to_the_unsplit_result():
    shape, lengths, _ = DECODE_CASES["bs16-gqa4-4-splits"]
    q, paged = _decode_inputs(shape, lengths)
    whole = _decode(q, paged.k, paged.v, paged.tables, lengths, shape, num_splits=1)
    for splits in (2, 5, 8):
        split = _decode(q, paged.k, paged.v, paged.tables, lengths, shape, num_splits=splits)
        torch.testing.assert_close(split, whole, atol=ATOL, rtol=RTOL)


def test_decode_chooses_its_splits_from_the_table_width():
    shape, lengths, _ = DECODE_CASES["bs16-gqa4-4-splits"]
    q, paged = _decode_inputs(shape, lengths)
    assert decode_splits(len(lengths), shape.kv_heads, paged.tables.shape[1] * 16) == 2
    out = _decode(q, paged.k, paged.v, paged.tables, lengths, shape)
    torch.testing.assert_close(out, _decode_ref(q, paged, lengths, shape), atol=ATOL, rtol=RTOL)


def test_decode_writes_into_the_given_out_and_scratch():
    shape, lengths, _ = DECODE_CASES["bs16-gqa2-3-splits"]
    q, paged = _decode_inputs(shape, lengths)
    out = torch.full_like(q, float("nan"))
    scratch = decode_scratch(len(lengths), shape.heads, shape.head_dim, 3, q.device)
    for t in scratch:
        t.fill_(float("nan"))  # stale scratch from an earlier step must not leak in
    result = _decode(
        q, paged.k, paged.v, paged.tables, lengths, shape, num_splits=3, out=out,
        scratch=scratch,
    )  # fmt: skip
    assert result is out
    torch.testing.assert_close(out, _decode_ref(q, paged, lengths, shape), atol=ATOL, rtol=RTOL)


def test_decode_split_count_follows_static_sizes_only():
    assert decode_splits(1, 8, 8192) == 32  # one long sequence: split as far as allowed
    assert decode_splits(4, 8, 8192) == 8  # enough programs for the device at 8 splits
    assert decode_splits(128, 8, 8192) == 1  # a big batch fills the device unsplit
    assert decode_splits(1, 8, 200) == 1  # short tables are not worth splitting
    assert decode_splits(1, 8, 8192, window=512) == 2  # a window bounds what is read
    assert decode_splits(0, 8, 8192) >= 1


# --- extend ------------------------------------------------------------------------------

EXTEND_CASES = {
    # name: (shape, [(cached prefix length, chunk length) per sequence])
    "no-prefix": (Shape(heads=2, kv_heads=2), [(0, 5), (0, 17), (0, 1)]),
    "prefix": (Shape(16, head_dim=64), [(8, 3), (0, 20), (33, 1), (16, 16)]),
    "gqa4-chunk-over-5-query-blocks": (Shape(16, heads=8), [(40, 70), (0, 9)]),
    "bs32-gqa4": (Shape(32, kv_heads=1), [(64, 40), (5, 27)]),
    "head-dim-80": (Shape(16, head_dim=80), [(10, 30), (0, 7)]),
    "softcap-and-scale": (Shape(softcap=3.0, scale=0.5), [(12, 9), (0, 13)]),
    "window": (Shape(window=16), [(60, 25), (0, 30), (7, 3)]),
    "window-softcap": (Shape(16, window=40, softcap=10.0), [(100, 70)]),
}


def _extend_inputs(
    shape: Shape,
    chunks: list[tuple[int, int]],
    dtype: torch.dtype = torch.float32,
    released: str = "-1",
):
    lengths = [start + n for start, n in chunks]
    window = shape.window
    first_seen = [0 if window is None else max(0, s - window + 1) for s, _ in chunks]
    cu = [0]
    for _, n in chunks:
        cu.append(cu[-1] + n)
    q = torch.randn(cu[-1], shape.heads, shape.head_dim)
    cu_seqlens = torch.tensor(cu, dtype=torch.int32)
    starts = torch.tensor([s for s, _ in chunks], dtype=torch.int32)
    return q, cu_seqlens, starts, paged_cache(shape, lengths, first_seen, dtype, released)


def _extend(q, k, v, tables, cu_seqlens, starts, shape, **kw):
    return paged_extend(
        q, k, v, tables, cu_seqlens, starts, _scale(shape),
        window=shape.window, softcap=shape.softcap, **kw,
    )  # fmt: skip


def _extend_ref(q, paged, cu_seqlens, starts, shape):
    return ref_paged_extend(
        q, paged.k, paged.v, paged.tables, cu_seqlens, starts, _scale(shape),
        window=shape.window, softcap=shape.softcap,
    )  # fmt: skip


@pytest.mark.parametrize("case", EXTEND_CASES)
def test_extend_matches_reference(case):
    shape, chunks = EXTEND_CASES[case]
    q, cu, starts, paged = _extend_inputs(shape, chunks)
    longest = max(n for _, n in chunks)
    out = _extend(q, paged.k, paged.v, paged.tables, cu, starts, shape, max_query_len=longest)
    torch.testing.assert_close(out, _extend_ref(q, paged, cu, starts, shape), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("case", EXTEND_CASES)
@pytest.mark.parametrize("released", ["-1", "nan-block"])
def test_extend_reads_nothing_a_query_does_not_see(case, released):
    shape, chunks = EXTEND_CASES[case]
    q, cu, starts, paged = _extend_inputs(shape, chunks, released=released)
    out = _extend(
        q, paged.poisoned_k, paged.poisoned_v, paged.poisoned_tables, cu, starts, shape,
        max_query_len=max(n for _, n in chunks),
    )  # fmt: skip
    torch.testing.assert_close(out, _extend_ref(q, paged, cu, starts, shape), atol=ATOL, rtol=RTOL)


def test_extend_without_max_query_len_covers_every_token():
    shape, chunks = EXTEND_CASES["prefix"]
    q, cu, starts, paged = _extend_inputs(shape, chunks)
    out = torch.full_like(q, float("nan"))
    result = _extend(q, paged.k, paged.v, paged.tables, cu, starts, shape, out=out)
    assert result is out
    torch.testing.assert_close(out, _extend_ref(q, paged, cu, starts, shape), atol=ATOL, rtol=RTOL)


def test_extend_of_one_token_per_sequence_equals_decode():
    shape, lengths, _ = DECODE_CASES["window-softcap-3-splits"]
    q, paged = _decode_inputs(shape, lengths)
    decoded = _decode(q, paged.k, paged.v, paged.tables, lengths, shape, num_splits=3)
    cu = torch.arange(len(lengths) + 1, dtype=torch.int32)
    starts = torch.tensor(lengths, dtype=torch.int32) - 1
    extended = _extend(q, paged.k, paged.v, paged.tables, cu, starts, shape, max_query_len=1)
    torch.testing.assert_close(extended, decoded, atol=ATOL, rtol=RTOL)


# --- half precision ------------------------------------------------------------------------


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float16, 2e-3), (torch.bfloat16, 2**-7)])
def test_half_precision_inputs_match_reference(dtype, tol):
    # Both compute in fp32 and cast once; the interpreter truncates that cast where a GPU
    # (and the reference) rounds, so one ulp of the dtype apart is expected here.
    shape, lengths, splits = DECODE_CASES["bs16-gqa2-3-splits"]
    q, paged = _decode_inputs(shape, lengths, dtype=dtype)
    q = q.to(dtype)
    out = _decode(q, paged.k, paged.v, paged.tables, lengths, shape, num_splits=splits)
    assert out.dtype == dtype
    torch.testing.assert_close(out, _decode_ref(q, paged, lengths, shape), atol=tol, rtol=tol)
    shape, chunks = EXTEND_CASES["prefix"]
    q, cu, starts, paged = _extend_inputs(shape, chunks, dtype=dtype)
    q = q.to(dtype)
    out = _extend(q, paged.k, paged.v, paged.tables, cu, starts, shape, max_query_len=20)
    torch.testing.assert_close(out, _extend_ref(q, paged, cu, starts, shape), atol=tol, rtol=tol)


# --- the reference is the engine's attention -----------------------------------------------


@pytest.mark.parametrize("softcap", [None, 3.0])
def test_reference_equals_the_engines_attention(softcap):
    shape = Shape(window=12, softcap=softcap, scale=0.4)
    start, n = 30, 9
    q, cu, starts, paged = _extend_inputs(shape, [(start, n)])
    ref = _extend_ref(q, paged, cu, starts, shape)
    positions = torch.arange(start + n)
    blocks = paged.tables[0].long()[positions // shape.block_size]
    ks, vs = (c[blocks, positions % shape.block_size] for c in (paged.k, paged.v))
    mask = causal_mask(start, start + n, shape.window, q.device)
    qs, ks, vs = (t.transpose(0, 1).unsqueeze(0) for t in (q, ks, vs))
    engine = attend(qs, ks, vs, mask, 0.4, softcap)[0].transpose(0, 1)
    torch.testing.assert_close(ref, engine, atol=ATOL, rtol=RTOL)


# --- bad inputs ----------------------------------------------------------------------------


def _good_decode_args() -> dict:
    shape, lengths, _ = DECODE_CASES["bs16-gqa2-3-splits"]
    q, paged = _decode_inputs(shape, lengths)
    return {
        "q": q, "k_cache": paged.k, "v_cache": paged.v, "block_tables": paged.tables,
        "context_lens": torch.tensor(lengths, dtype=torch.int32), "scale": 0.1,
    }  # fmt: skip


BAD_DECODE = {
    "q of two dims": ({"q": torch.randn(4, 64)}, "q must be"),
    "values shaped unlike keys": ({"v_cache": torch.randn(3, 16, 2, 64)}, "k_cache and v_cache"),
    "head_dim mismatch": ({"q": torch.randn(4, 4, 32)}, "head_dim"),
    "heads not a multiple of kv heads": ({"q": torch.randn(4, 3, 64)}, "multiple of kv_heads"),
    "fp16 q on fp32 cache": ({"q": torch.randn(4, 4, 64).half()}, "share one dtype"),
    "int64 block tables": ({"block_tables": torch.zeros(4, 13, dtype=torch.long)}, "int32"),
    "int64 context lengths": ({"context_lens": torch.ones(4, dtype=torch.long)}, "context_lens"),
    "a context length short": ({"context_lens": torch.ones(3, dtype=torch.int32)}, "context_lens"),
    "zero window": ({"window": 0}, "window"),
    "negative softcap": ({"softcap": -1.0}, "softcap"),
    "zero splits": ({"num_splits": 0}, "num_splits"),
    "out of the wrong shape": ({"out": torch.empty(4, 4, 32)}, "out must match"),
    "scratch too small": (
        {"num_splits": 3, "scratch": decode_scratch(4, 4, 64, 2, "cpu")},
        "scratch part_out",
    ),
}


@pytest.mark.parametrize("case", BAD_DECODE)
def test_decode_refuses_bad_inputs_with_a_clear_error(case):
    override, message = BAD_DECODE[case]
    args = _good_decode_args() | override
    with pytest.raises(ValueError, match=message):
        paged_decode(**args)


BAD_EXTEND = {
    "cu_seqlens one short": ({"cu_seqlens_q": torch.tensor([0, 3], dtype=torch.int32)}, "cu_seq"),
    "int64 context starts": ({"context_starts": torch.zeros(2, dtype=torch.long)}, "context_st"),
    "negative max_query_len": ({"max_query_len": -1}, "max_query_len"),
    "window of a float": ({"window": 4.0}, "window"),
}


@pytest.mark.parametrize("case", BAD_EXTEND)
def test_extend_refuses_bad_inputs_with_a_clear_error(case):
    override, message = BAD_EXTEND[case]
    shape, chunks = EXTEND_CASES["head-dim-80"]
    q, cu, starts, paged = _extend_inputs(shape, chunks)
    args = {
        "q": q, "k_cache": paged.k, "v_cache": paged.v, "block_tables": paged.tables,
        "cu_seqlens_q": cu, "context_starts": starts, "scale": 0.1,
    } | override  # fmt: skip
    with pytest.raises(ValueError, match=message):
        paged_extend(**args)
