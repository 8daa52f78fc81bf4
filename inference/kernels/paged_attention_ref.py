"""Paged attention in plain torch, one sequence at a time: what the Triton kernels in
paged_attention.py must equal (the tests and the GPU suite compare them).

Dense and simple on purpose: each sequence's visible keys and values are gathered from the
cache into a contiguous copy and attended in fp32. Like the kernels, it never looks up a
block that lies wholly behind the sliding window, so -1 table entries there are fine.
"""

import torch


def ref_paged_extend(
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
) -> torch.Tensor:
    """paged_extend's result: sequence i's queries q[cu[i]:cu[i+1]] sit at positions
    context_starts[i] on and see keys k <= their position (and > position - window)."""
    out = torch.zeros_like(q)
    for i in range(block_tables.shape[0]):
        begin, end = int(cu_seqlens_q[i]), int(cu_seqlens_q[i + 1])
        start = int(context_starts[i])
        out[begin:end] = _attend_one(
            q[begin:end], k_cache, v_cache, block_tables[i], start, scale, window, softcap
        )
    return out


def ref_paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    *,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """paged_decode's result: one query per sequence, at position context_lens[i] - 1
    (zeros for a sequence of length 0)."""
    out = torch.zeros_like(q)
    for i in range(q.shape[0]):
        length = int(context_lens[i])
        if length:
            out[i : i + 1] = _attend_one(
                q[i : i + 1], k_cache, v_cache, block_tables[i], length - 1, scale, window, softcap
            )
    return out


def _attend_one(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    table: torch.Tensor,
    start: int,
    scale: float,
    window: int | None,
    softcap: float | None,
) -> torch.Tensor:
    """q [n, heads, dim] at positions start..start+n-1 over the cached keys they see."""
    n, num_heads, _ = q.shape
    total = start + n
    first = 0 if window is None else max(0, start - window + 1)  # the first query's window
    positions = torch.arange(first, total, device=q.device)
    block_size = k_cache.shape[1]
    blocks = table.to(q.device, torch.long)[positions // block_size]
    rows = positions % block_size
    k = k_cache[blocks, rows].float()  # [keys, kv_heads, dim]
    v = v_cache[blocks, rows].float()
    group = num_heads // k.shape[1]
    k = k.repeat_interleave(group, dim=1).transpose(0, 1)  # [heads, keys, dim]
    v = v.repeat_interleave(group, dim=1).transpose(0, 1)
    scores = torch.matmul(q.float().transpose(0, 1), k.transpose(1, 2)) * scale
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    query_pos = torch.arange(start, total, device=q.device)[:, None]
    visible = positions[None, :] <= query_pos
    if window is not None:
        visible &= positions[None, :] > query_pos - window
    scores = scores.masked_fill(~visible, float("-inf"))
    out = torch.matmul(torch.softmax(scores, dim=-1), v)  # [heads, n, dim]
    return out.transpose(0, 1).to(q.dtype)
