"""What one forward pass needs to know about its batch, beyond the token ids.

The model runner builds a ForwardContext per step and sets it for the duration of the
forward; attention reads it, and LoRA layers read their per-token adapter slots from it.
It is thread-local so two engines in one process cannot see each other's batch.
"""

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from inference.kernels.lora_batch import LoRABatch

_local = threading.local()

# (slot, its tokens' rows in the batch, or None when every token is that slot's)
SlotRows = list[tuple[int, torch.Tensor | None]]


@dataclass
class LoRAStep:
    """What the LoRA layers (lora/apply.py) read from the ForwardContext in one step."""

    batch: LoRABatch
    buffer: torch.Tensor  # fp32 scratch [max slices, >= num_tokens, max_lora_rank]
    extra_rows: SlotRows  # slots of this batch whose adapters have extras (DoRA, heads)


@dataclass
class PagedStep:
    """The step as the Triton paged-attention kernels read it (attention backend "triton"):
    int32 tables, every key and value read from the cache in place."""

    # prefill chunks, in the order of cu_seqlens: each sequence's blocks (padded), where its
    # chunk starts, and the longest chunk
    prefill_tables: torch.Tensor | None = None  # [prefill seqs, max blocks]
    cu_seqlens_q: torch.Tensor | None = None  # [prefill seqs + 1]
    context_starts: torch.Tensor | None = None  # [prefill seqs]
    max_query_len: int = 0
    # decodes, in the decode rows' order
    decode_tables: torch.Tensor | None = None  # [decodes, max blocks]
    context_lens: torch.Tensor | None = None  # [decodes], the fed token included


@dataclass
class DecodeGroup:
    """Decode rows start..end, which attend in one call: over kept buffer `buffer`'s slots
    from `slot` on, one row per slot, or (no buffers kept) over the step's gathered copy
    from row `slot` on."""

    start: int
    end: int
    buffer: int
    slot: int
    width: int  # tokens of the group's longest sequence
    # [end - start, 1, 1, width] additive: 0 where a cached token is attended, -inf not;
    # made on the device when the step is uploaded
    mask: torch.Tensor | None = None


@dataclass
class DecodeBufferPlan:
    """The CPU decode buffers in one step as the host planned them (decode_buffers.py), so
    every layer, on every rank, keeps the same ones. A buffer holds the keys (and one the
    values) of up to `slots` sequences, [slots, kv_heads, capacity, head_dim]; a layer
    allocates a buffer that is new, copies one whose capacity grew, and drops one not listed."""

    buffers: dict[int, tuple[int, int]] = field(default_factory=dict)  # id -> (slots, capacity)
    # (decode row, buffer, slot, tokens): copy the row's first `tokens` cached tokens into
    # its slot: a sequence that joins the decode batch, or whose slot no longer matches
    fills: list[tuple[int, int, int, int]] = field(default_factory=list)


@dataclass
class ForwardContext:
    """A step feeds prefill chunks first, then decodes (one token per sequence)."""

    slot_mapping: torch.Tensor  # [num_tokens] KV-cache slot each fed token is written to
    # prefill chunks: sequence i's tokens are cu_seqlens[i]:cu_seqlens[i+1], at positions
    # from context_starts[i] on; one that starts past 0 attends over its earlier tokens in
    # the cache, through prefill_block_tables[i] (its blocks; None when it starts at 0)
    cu_seqlens: list[int] = field(default_factory=lambda: [0])
    context_starts: list[int] = field(default_factory=list)
    prefill_block_tables: list[torch.Tensor | None] = field(default_factory=list)
    # decode: one token per sequence, attending over its blocks
    block_tables: torch.Tensor | None = None  # [num_seqs, max_blocks], padded with block 0
    context_lens: torch.Tensor | None = None  # [num_seqs], the fed token included
    # the decode rows in groups that attend as one call each
    decode_groups: list[DecodeGroup] | None = None
    # on the CPU: the decode buffers attention keeps, each sequence's keys and values copied
    # from the cache once and extended by its new token each step; None: none kept, every
    # step gathers the decodes' keys and values from the cache afresh
    decode_plan: DecodeBufferPlan | None = None
    # (decode group, window) -> that group's mask for sliding-window layers, made on first use
    window_masks: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)
    # decode group -> where its new keys and values go in its buffer, made on first use
    decode_append: dict[int, torch.Tensor] = field(default_factory=dict)
    # on the CPU: the fed tokens' rows in the pool seen as rows (attention.store_kv_rows),
    # less the layer's own offset; made on first use
    cache_rows: torch.Tensor | None = None
    # set when attention runs on the Triton paged kernels
    paged: PagedStep | None = None
    # the batch's adapters; None when no token uses one, so LoRA costs nothing
    lora: LoRAStep | None = None
    # the adapters that change lm_head, by the rows whose logits are computed (those rows
    # only: the runner samples a subset of the fed tokens); None when none does
    lora_head: SlotRows | None = None

    @property
    def num_prefill_tokens(self) -> int:
        return self.cu_seqlens[-1]

    @property
    def has_decodes(self) -> bool:
        return self.block_tables is not None


def get_forward_context() -> ForwardContext:
    ctx: ForwardContext | None = getattr(_local, "ctx", None)
    assert ctx is not None, "the model runs only inside forward_context(...)"
    return ctx


@contextmanager
def forward_context(ctx: ForwardContext) -> Iterator[ForwardContext]:
    previous = getattr(_local, "ctx", None)
    _local.ctx = ctx
    try:
        yield ctx
    finally:
        _local.ctx = previous
