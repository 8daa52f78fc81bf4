"""One layer's decode keys and values on the CPU, kept between steps as the host plans them
(decode_buffers.py). Each buffer is a [slots, capacity, kv_heads, head_dim] tensor for keys
and one for values: token-major like the cache's pages, so a sequence's blocks copy into
its slot as they are, and attention reads a [slots, kv_heads, tokens, head_dim] view of it
without a copy (the CPU SDPA kernel takes strided keys). A slot holds its sequence's tokens
and zeros past them, which attention masks out (finite: a masked score must not be NaN);
a slot nobody holds is never read, so a buffer is not cleared when made.

The paged cache is only read by block id, never as one flat tensor, so its pages may be
strided views and may move between steps: the buffers hold copies."""

import torch

from .context import DecodeBufferPlan, DecodeGroup


class DecodeKV:
    def __init__(self) -> None:
        self.buffers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        # tokens (each its keys and values) copied in the last step: from the cache into
        # slots, and within buffers whose capacity grew
        self.copied_tokens = 0
        self.moved_tokens = 0

    def clear(self) -> None:
        self.buffers = {}
        self.copied_tokens = self.moved_tokens = 0

    def apply(
        self,
        plan: DecodeBufferPlan,
        tables: torch.Tensor | None,
        caches: tuple[torch.Tensor, torch.Tensor],
    ) -> None:
        """Make, grow and drop buffers as planned, then fill the slots the plan names from
        the cache (`tables`: the decode rows' block tables)."""
        self.copied_tokens = self.moved_tokens = 0
        pages, block_size, kv_heads, head_dim = caches[0].shape
        kept: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for i, (slots, capacity) in plan.buffers.items():
            old = self.buffers.get(i)
            if old is not None and old[0].shape[1] == capacity:
                kept[i] = old
                continue
            new = (
                caches[0].new_empty(slots, capacity, kv_heads, head_dim),
                caches[1].new_empty(slots, capacity, kv_heads, head_dim),
            )
            if old is not None:  # grown: what it holds moves over
                n = min(old[0].shape[1], capacity)
                for buffer, held in zip(new, old, strict=True):
                    buffer[:, :n] = held[:, :n]
                    buffer[:, n:] = 0
                self.moved_tokens += slots * n
            kept[i] = new
        self.buffers = kept
        for row, i, slot, tokens in plan.fills:
            assert tables is not None, "a fill is for a decode row"
            # a block let go behind a sliding window (-1) reads the last page: masked out
            blocks = tables[row, : -(-tokens // block_size)].remainder(pages)
            span = len(blocks) * block_size  # capacities are whole blocks
            for buffer, cache in zip(self.buffers[i], caches, strict=True):
                into = buffer[slot, :span].view(len(blocks), block_size, kv_heads, head_dim)
                torch.index_select(cache, 0, blocks, out=into)
                buffer[slot, tokens:] = 0
            self.copied_tokens += tokens

    def append(
        self, k: torch.Tensor, v: torch.Tensor, groups: list[DecodeGroup], lengths: torch.Tensor
    ) -> None:
        """Write each decode row's new key and value [rows, kv_heads, head_dim] at its
        position (`lengths` - 1) in its slot."""
        for g in groups:
            rows = slice(g.start, g.end)
            at = (lengths[rows] - 1).view(-1, 1, 1, 1).expand(-1, 1, k.shape[1], k.shape[2])
            keys, values = self.buffers[g.buffer]
            keys[g.slot : g.slot + g.end - g.start].scatter_(1, at, k[rows].unsqueeze(1))
            values[g.slot : g.slot + g.end - g.start].scatter_(1, at, v[rows].unsqueeze(1))

    def group_kv(self, g: DecodeGroup) -> tuple[torch.Tensor, torch.Tensor]:
        """A group's keys and values as [rows, kv_heads, width, head_dim] views."""
        keys, values = self.buffers[g.buffer]
        slots = slice(g.slot, g.slot + g.end - g.start)
        return keys[slots, : g.width].transpose(1, 2), values[slots, : g.width].transpose(1, 2)
