"""Attention over the paged KV cache: the one place a paged-attention kernel plugs in.

Layout: each layer's cache is a [num_blocks, block_size, num_kv_heads, head_dim] view for
keys and one for values, strided over the pool's pages (kv_cache.py); on the CPU a layer
also writes through the pool seen as rows, one per token (store_kv_rows). Queries are grouped
by KV head (GQA): q head h reads KV head h // (num_heads // num_kv_heads), so no key or
value is ever repeated.
"""

import torch
import torch.nn.functional as F
from torch import nn

from .context import ForwardContext, PagedStep, get_forward_context
from .decode_kv import DecodeKV, append_rows


def store_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write the fed tokens' keys and values [T, kv_heads, head_dim] into their cache slots
    (slot = block * block_size + offset). The caches are views strided over the pool's
    pages (kv_cache.py), so they are indexed by block and offset, never flattened."""
    block_size = k_cache.shape[1]
    index = (slot_mapping // block_size, slot_mapping % block_size)
    k_cache.index_put_(index, k)
    v_cache.index_put_(index, v)


def store_kv_rows(
    layer: "Attention", k: torch.Tensor, v: torch.Tensor, ctx: ForwardContext
) -> None:
    """store_kv through the pool seen as [-1, kv_heads * head_dim] rows (kv_cache.py): one
    contiguous row copy per token, where indexing a strided view by block and offset costs
    many times that on the CPU. The fed tokens' rows within their pages are found once per
    step; each layer adds its own offset (its keys, then its values further on). Not on
    the Triton kernels' steps: a decode graph replays one context, its slots changed in place."""
    rows = layer.kv_rows
    assert rows is not None
    if ctx.cache_rows is None:
        block_size = layer.k_cache.shape[1]
        page = ctx.slot_mapping // block_size
        ctx.cache_rows = page * layer.rows_per_page + ctx.slot_mapping % block_size
    at = ctx.cache_rows + layer.key_rows_offset
    rows.index_copy_(0, at, k.flatten(1))
    rows.index_copy_(0, at + layer.rows_per_page // 2, v.flatten(1))


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    softcap: float | None,
) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v over [batch, heads, tokens, head_dim], where k and v
    may have fewer (grouped) heads. Without a mask, causal. With `softcap` (Gemma 2) the
    scores pass through cap * tanh(s / cap) first, which SDPA cannot do: computed here, a
    head at a time, since k and v may be strided views (the decode buffers) that a matmul
    batched over heads would copy whole."""
    if softcap is None:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=True
        )
    if k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    if mask is None:
        mask = causal_mask(0, q.shape[-2], None, q.device)
    out = q.new_empty(q.shape)
    for h in range(q.shape[1]):
        head_mask = mask if mask.dim() < 4 else mask[:, h if mask.shape[1] > 1 else 0]
        scores = torch.matmul(q[:, h], k[:, h].transpose(-1, -2))
        scores = torch.tanh(scores * (scale / softcap)) * softcap
        if head_mask.dtype == torch.bool:
            scores = scores.masked_fill(~head_mask, float("-inf"))
        else:
            scores = scores + head_mask
        out[:, h] = torch.matmul(torch.softmax(scores.float(), dim=-1).to(q.dtype), v[:, h])
    return out


def causal_mask(start: int, total: int, window: int | None, device: torch.device) -> torch.Tensor:
    """[total - start, total]: query at position p (from `start` on) sees keys 0..p, or only
    the last `window` of them (p - window < key <= p) in a sliding-window layer."""
    query_pos = torch.arange(start, total, device=device)[:, None]
    key_pos = torch.arange(total, device=device)[None, :]
    mask = key_pos <= query_pos
    if window is not None:
        mask &= key_pos > query_pos - window
    return mask


def prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    ctx: ForwardContext,
    caches: tuple[torch.Tensor, torch.Tensor],
    layer: "Attention",
) -> torch.Tensor:
    """Causal attention of each prefill chunk over its sequence so far. A chunk that starts
    the sequence uses its just-computed keys and values directly; a later chunk (or one
    after a cached prefix) reads the earlier ones from the cache, where this layer has
    already stored the chunk's own."""
    out = torch.empty_like(q)
    bounds = zip(ctx.cu_seqlens[:-1], ctx.cu_seqlens[1:], strict=True)
    for (begin, end), start, table in zip(
        bounds, ctx.context_starts, ctx.prefill_block_tables, strict=True
    ):
        total = start + end - begin
        if table is None:
            ks, vs = k[begin:end], v[begin:end]
        else:  # index_select: indexing the strided pages copies element by element; a
            # block let go behind a sliding window (-1) reads the last page, masked out
            blocks = table.remainder(caches[0].shape[0])
            ks, vs = (torch.index_select(c, 0, blocks).flatten(0, 1)[:total] for c in caches)
        slides = layer.window is not None and layer.window < total
        mask = None  # plain causal: SDPA's own is faster than a mask
        if table is not None or slides or layer.softcap is not None:
            mask = causal_mask(start, total, layer.window, q.device)
        qs, ks, vs = (t.transpose(0, 1).unsqueeze(0) for t in (q[begin:end], ks, vs))
        o = attend(qs, ks, vs, mask, layer.scale, layer.softcap)
        out[begin:end] = o[0].transpose(0, 1)
    return out


def gather_kv(cache: torch.Tensor, block_tables: torch.Tensor, length: int) -> torch.Tensor:
    """The sequences' cached keys (or values), padded: [seqs, kv_heads, length, head_dim].
    Padding holds zeros or other sequences' values: finite, and masked out by the caller."""
    blocks = cache[block_tables].flatten(1, 2)  # [seqs, max_blocks * block_size, kv_heads, dim]
    seqs, n, kv_heads, dim = blocks.shape
    out = blocks.new_empty(seqs, kv_heads, length, dim)
    out[:, :, :n] = blocks.transpose(1, 2)
    out[:, :, n:] = 0
    return out


def decode_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    ctx: ForwardContext,
    layer: "Attention",
) -> torch.Tensor:
    """One new token per sequence against all its cached tokens: a batched call per group
    over padded [seqs, kv_heads, length, head_dim] keys and values, the kept buffers' (see
    DecodeKV) or, with none kept, a copy gathered from the cache this step. The query heads
    that share a KV head take the place of the query-length dimension."""
    num_seqs, num_heads, head_dim = q.shape
    kv_heads = k.shape[1]
    qg = q.view(num_seqs, kv_heads, num_heads // kv_heads, head_dim)
    out = q.new_empty(qg.shape)
    groups = ctx.decode_groups
    assert groups is not None and ctx.context_lens is not None, "a decode step has its groups"
    buffers = layer.decode_kv
    if ctx.decode_plan is None:  # every cached token gathered afresh (the new one is stored)
        tables = ctx.block_tables
        assert tables is not None
        width = tables.shape[1] * layer.k_cache.shape[1]
        gathered = gather_kv(layer.k_cache, tables, width), gather_kv(layer.v_cache, tables, width)
        buffers.copied_tokens = num_seqs * width
    else:
        buffers.append(k, v, groups, decode_append_rows(ctx, kv_heads))
    for i, group in enumerate(groups):
        if ctx.decode_plan is None:
            ks, vs = (t[group.slot : group.slot + group.end - group.start] for t in gathered)
            ks, vs = ks[:, :, : group.width], vs[:, :, : group.width]
        else:
            ks, vs = buffers.group_kv(group)
        mask = group.mask
        if layer.window is not None:
            mask = window_decode_mask(ctx, i, layer.window)
        out[group.start : group.end] = attend(
            qg[group.start : group.end], ks, vs, mask, layer.scale, layer.softcap
        )
    return out.view(num_seqs, num_heads, head_dim)


def decode_append_rows(ctx: ForwardContext, kv_heads: int) -> dict[int, torch.Tensor]:
    """Each decode group's rows for its new keys and values in its buffer (append_rows);
    made once per step, shared by every layer."""
    if not ctx.decode_append:
        assert ctx.decode_groups is not None and ctx.context_lens is not None
        assert ctx.decode_plan is not None
        for i, g in enumerate(ctx.decode_groups):
            capacity = ctx.decode_plan.buffers[g.buffer][1]
            ctx.decode_append[i] = append_rows(g, ctx.context_lens, capacity, kv_heads)
    return ctx.decode_append


def window_decode_mask(ctx: ForwardContext, group: int, window: int) -> torch.Tensor:
    """A decode group's mask with the tokens before each sequence's window masked out as
    well; made once per step and window, shared by the layers that slide."""
    key = (group, window)
    if key not in ctx.window_masks:
        assert ctx.decode_groups is not None and ctx.context_lens is not None
        g = ctx.decode_groups[group]
        assert g.mask is not None, "masks are made at upload"
        first = (ctx.context_lens[g.start : g.end] - window).view(-1, 1, 1, 1)
        positions = torch.arange(g.mask.shape[-1], device=g.mask.device)
        ctx.window_masks[key] = g.mask.masked_fill(positions < first, float("-inf"))
    return ctx.window_masks[key]


class Attention(nn.Module):
    """Stores this layer's new keys/values in the cache, then attends. The model runner
    assigns `k_cache`/`v_cache` once the cache is allocated, and on the CPU the pool's rows
    (`kv_rows`: rows_per_page a page, this layer's keys from key_rows_offset on)."""

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float | None = None,
        window: int | None = None,
        softcap: float | None = None,
    ):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = head_dim**-0.5 if scale is None else scale
        self.window = window  # sliding-window layer: attends to the last `window` tokens only
        self.softcap = softcap
        self.k_cache = self.v_cache = torch.empty(0)
        self.kv_rows: torch.Tensor | None = None
        self.rows_per_page = self.key_rows_offset = 0
        self.decode_kv = DecodeKV()  # on the CPU, the decode batch's keys and values kept

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        ctx = get_forward_context()
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        caches = (self.k_cache, self.v_cache)
        if self.k_cache.numel():
            if self.kv_rows is not None and ctx.paged is None:
                store_kv_rows(self, k, v, ctx)
            else:
                store_kv(self.k_cache, self.v_cache, k, v, ctx.slot_mapping)
            if ctx.paged is not None:
                return self.paged_attention(q, ctx.paged, ctx.num_prefill_tokens).flatten(1)
            if ctx.decode_plan is None:
                self.decode_kv.clear()
            else:
                self.decode_kv.apply(ctx.decode_plan, ctx.block_tables, caches)
        if not ctx.has_decodes:
            return prefill_attention(q, k, v, ctx, caches, self).flatten(1)
        p = ctx.num_prefill_tokens
        out = q.new_empty(q.shape)
        if p:
            out[:p] = prefill_attention(q[:p], k[:p], v[:p], ctx, caches, self)
        out[p:] = decode_attention(q[p:], k[p:], v[p:], ctx, self)
        return out.flatten(1)

    def paged_attention(self, q: torch.Tensor, step: PagedStep, num_prefill: int) -> torch.Tensor:
        """Prefill chunks, then decodes, on the Triton kernels, reading the cache in place."""
        from inference.kernels import paged_attention as kernels  # imports triton: only here

        out = torch.empty_like(q)
        if num_prefill:
            assert step.prefill_tables is not None and step.cu_seqlens_q is not None
            assert step.context_starts is not None
            kernels.paged_extend(
                q[:num_prefill],
                self.k_cache,
                self.v_cache,
                step.prefill_tables,
                step.cu_seqlens_q,
                step.context_starts,
                self.scale,
                max_query_len=step.max_query_len,
                out=out[:num_prefill],
                window=self.window,
                softcap=self.softcap,
            )
        if num_prefill < q.shape[0]:
            assert step.decode_tables is not None and step.context_lens is not None
            kernels.paged_decode(
                q[num_prefill:],
                self.k_cache,
                self.v_cache,
                step.decode_tables,
                step.context_lens,
                self.scale,
                out=out[num_prefill:],
                window=self.window,
                softcap=self.softcap,
            )
        return out
