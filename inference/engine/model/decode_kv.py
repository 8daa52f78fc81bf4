"""One layer's decode keys and values on the CPU, kept between steps as the host plans them
(decode_buffers.py). Each buffer is a [slots, kv_heads, capacity, head_dim] tensor for keys
and one for values: head-major, so attention reads each group's [slots, kv_heads, tokens,
head_dim] slice with every head's tokens contiguous, as the CPU SDPA kernel reads fastest.
A slot holds its sequence's tokens and zeros past them, which attention masks out (finite: a
masked score must not be NaN); a slot nobody holds is never read, so a buffer is not cleared
when made.

The paged cache is only read by block id, never as one flat tensor, so its pages may be
strided views and may move between steps: the buffers hold copies, transposed from the
cache's token-major pages when a sequence joins."""

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
            if old is not None and old[0].shape[2] == capacity:
                kept[i] = old
                continue
            new = (
                caches[0].new_empty(slots, kv_heads, capacity, head_dim),
                caches[1].new_empty(slots, kv_heads, capacity, head_dim),
            )
            if old is not None:  # grown: what it holds moves over
                n = min(old[0].shape[2], capacity)
                for buffer, held in zip(new, old, strict=True):
                    buffer[:, :, :n] = held[:, :, :n]
                    buffer[:, :, n:] = 0
                self.moved_tokens += slots * n
            kept[i] = new
        self.buffers = kept
        for row, i, slot, tokens in plan.fills:
            assert tables is not None, "a fill is for a decode row"
            # a block let go behind a sliding window (-1) reads the last page: masked out
            blocks = tables[row, : -(-tokens // block_size)].remainder(pages)
            for buffer, cache in zip(self.buffers[i], caches, strict=True):
                cached = cache.index_select(0, blocks).flatten(0, 1)[:tokens]
                buffer[slot, :, :tokens] = cached.transpose(0, 1)
                buffer[slot, :, tokens:] = 0
            self.copied_tokens += tokens

    def append(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        groups: list[DecodeGroup],
        rows: dict[int, torch.Tensor],
    ) -> None:
        """Write each decode row's new key and value [rows, kv_heads, head_dim] into its
        slot, group i's at `rows[i]` of the buffer seen as [-1, head_dim] (append_rows)."""
        head_dim = k.shape[-1]
        for i, g in enumerate(groups):
            keys, values = self.buffers[g.buffer]
            keys.view(-1, head_dim).index_copy_(0, rows[i], k[g.start : g.end].flatten(0, 1))
            values.view(-1, head_dim).index_copy_(0, rows[i], v[g.start : g.end].flatten(0, 1))

    def group_kv(self, g: DecodeGroup) -> tuple[torch.Tensor, torch.Tensor]:
        """A group's keys and values as [rows, kv_heads, width, head_dim] slices."""
        keys, values = self.buffers[g.buffer]
        slots = slice(g.slot, g.slot + g.end - g.start)
        return keys[slots, :, : g.width], values[slots, :, : g.width]


def append_rows(
    g: DecodeGroup, lengths: torch.Tensor, capacity: int, kv_heads: int
) -> torch.Tensor:
    """Where a group's new keys (and values) go in its buffer seen as [-1, head_dim]: row
    (slot * kv_heads + head) * capacity + position for each of its rows, then heads, the
    position being the row's length - 1."""
    slots = torch.arange(g.slot, g.slot + g.end - g.start, device=lengths.device)
    heads = torch.arange(kv_heads, device=lengths.device)
    positions = lengths[g.start : g.end] - 1
    return ((slots[:, None] * kv_heads + heads) * capacity + positions[:, None]).flatten()
