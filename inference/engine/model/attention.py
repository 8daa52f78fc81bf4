"""Attention over the paged KV cache: the one place a paged-attention kernel plugs in.

Layout: each layer's cache is a [num_blocks, block_size, num_kv_heads, head_dim] tensor for
keys and one for values. Queries are grouped by KV head (GQA): q head h reads KV head
h // (num_heads // num_kv_heads), so no key or value is ever repeated.
"""

import torch
import torch.nn.functional as F
from torch import nn

from .context import ForwardContext, get_forward_context


def store_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write the fed tokens' keys and values [T, kv_heads, head_dim] into their cache slots."""
    k_cache.view(-1, *k.shape[1:]).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, *v.shape[1:]).index_copy_(0, slot_mapping, v)


def prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    ctx: ForwardContext,
    caches: tuple[torch.Tensor, torch.Tensor],
    scale: float,
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
        if table is None:
            ks, vs, mask = k[begin:end], v[begin:end], None
        else:
            total = start + end - begin
            ks, vs = (cache[table].flatten(0, 1)[:total] for cache in caches)
            query_pos = torch.arange(start, total, device=q.device)
            mask = torch.arange(total, device=q.device)[None, :] <= query_pos[:, None]
        qs, ks, vs = (t.transpose(0, 1).unsqueeze(0) for t in (q[begin:end], ks, vs))
        o = F.scaled_dot_product_attention(
            qs, ks, vs, attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=True
        )
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
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: ForwardContext, scale: float
) -> torch.Tensor:
    """One new token per sequence against all its cached tokens: a batched call per group of
    similar lengths over padded [seqs, kv_heads, length, head_dim] keys and values. The
    query heads that share a KV head take the place of the query-length dimension."""
    num_seqs, num_heads, head_dim = q.shape
    kv_heads = k.shape[1]
    qg = q.view(num_seqs, kv_heads, num_heads // kv_heads, head_dim)
    out = q.new_empty(qg.shape)
    assert ctx.decode_groups is not None, "a decode step has its groups"
    for start, end, mask in ctx.decode_groups:
        width = mask.shape[-1]
        out[start:end] = F.scaled_dot_product_attention(
            qg[start:end], k[start:end, :, :width], v[start:end, :, :width], mask, scale=scale
        )
    return out.view(num_seqs, num_heads, head_dim)


class Attention(nn.Module):
    """Stores this layer's new keys/values in the cache, then attends. The model runner
    assigns `k_cache`/`v_cache` once the cache is allocated."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = head_dim**-0.5
        self.k_cache = self.v_cache = torch.empty(0)
        self.k_buffer: torch.Tensor | None = None  # see decode_kv
        self.v_buffer: torch.Tensor | None = None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        ctx = get_forward_context()
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.k_cache.numel():
            store_kv(self.k_cache, self.v_cache, k, v, ctx.slot_mapping)
        if not ctx.has_decodes:
            self.k_buffer = self.v_buffer = None  # the next decode batch differs; free them now
            return prefill_attention(
                q, k, v, ctx, (self.k_cache, self.v_cache), self.scale
            ).flatten(1)
        p = ctx.num_prefill_tokens
        out = q.new_empty(q.shape)
        if p:
            out[:p] = prefill_attention(
                q[:p], k[:p], v[:p], ctx, (self.k_cache, self.v_cache), self.scale
            )
        out[p:] = decode_attention(q[p:], *self.decode_kv(k[p:], v[p:], ctx), ctx, self.scale)
        return out.flatten(1)

    def decode_kv(
        self, k: torch.Tensor, v: torch.Tensor, ctx: ForwardContext
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Padded keys and values of the decode batch. Gathering every cached token of every
        sequence each step costs as much as the matmuls on a CPU, so when the runner allows
        it the gathered copy is kept and only the new token is written into it next step."""
        tables = ctx.block_tables
        assert tables is not None and ctx.context_lens is not None, "a decode step has its tables"
        if ctx.decode_buffer_len is None:  # gather afresh every step and keep nothing
            self.k_buffer = self.v_buffer = None
            width = tables.shape[1] * self.k_cache.shape[1]
            return gather_kv(self.k_cache, tables, width), gather_kv(self.v_cache, tables, width)
        if ctx.refresh_decode_buffers or self.k_buffer is None or self.v_buffer is None:
            self.k_buffer = gather_kv(self.k_cache, tables, ctx.decode_buffer_len)
            self.v_buffer = gather_kv(self.v_cache, tables, ctx.decode_buffer_len)
        else:
            rows = torch.arange(k.shape[0], device=k.device)
            self.k_buffer[rows, :, ctx.context_lens - 1] = k
            self.v_buffer[rows, :, ctx.context_lens - 1] = v
        return self.k_buffer, self.v_buffer
