"""A scheduled batch as the model takes it: one flat row per fed token (prefill chunks, then
decodes) with its position, KV slot and adapter slot, the block tables attention reads, and
which hidden rows become logits.

A step's inputs are built on the host, then uploaded in one copy through a staging buffer
(staging.py); under tensor parallelism the host inputs are what rank 0 sends, and each rank
uploads its own."""

import dataclasses
import itertools
from collections.abc import Sequence as SequenceOf
from dataclasses import dataclass, field
from typing import Any

import torch

from .config import EngineConfig
from .cuda_graphs import DecodeRows
from .decode_buffers import DecodeBufferPlanner
from .model.context import DecodeGroup, ForwardContext, PagedStep
from .model.rotary import uses_long_factors
from .scheduler import ScheduledBatch
from .sequence import Sequence
from .staging import ALIGN, Staging


@dataclass
class ForwardInputs:
    """One forward pass, flat over the batch, on the host: what every rank of a sharded
    model runs (the context's tensors on the CPU, without its LoRA fields, which each rank
    builds)."""

    ctx: ForwardContext
    input_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)  # hidden rows to turn into logits
    lora_slots: list[int] = field(default_factory=list)  # each fed token's adapter slot


@dataclass
class DeviceInputs:
    """A forward pass's inputs after the upload: the context and the fed tokens on the device."""

    ctx: ForwardContext
    input_ids: torch.Tensor
    positions: torch.Tensor
    rows: torch.Tensor  # hidden rows to turn into logits


@dataclass
class BatchInputs:
    """A batch's forward inputs, and which of their logits rows go where."""

    forward: ForwardInputs
    samplers: list[Sequence] = field(default_factory=list)  # sequences that sample a token
    sample_at: list[int] = field(default_factory=list)  # where in `rows` each sampler's row is
    # (seq, position, first row, rows) of the prompt logprobs a chunk computes
    prompt_spans: list[tuple[Sequence, int, int, int]] = field(default_factory=list)


def step_staging_bytes(config: EngineConfig) -> int:
    """The staging a step at the engine's limits needs: four int64 values per batched token
    (id, position, KV slot, logits row), one block table per sequence, three bounds per
    sequence, each section aligned."""
    assert config.max_model_len is not None and config.max_num_batched_tokens is not None
    seqs = config.max_num_seqs
    max_blocks = -(-config.max_model_len // config.block_size)
    table_item = 4 if config.attention_backend == "triton" else 8  # int32 for the paged kernels
    sections = 9 + seqs  # the fixed sections, and a table per prefill chunk (torch attention)
    return (
        4 * 8 * config.max_num_batched_tokens
        + seqs * max_blocks * table_item
        + 3 * 8 * (seqs + 1)
        + sections * ALIGN
    )


class InputBuilder:
    """Builds each step's inputs on the host and uploads them, and plans the CPU decode
    buffers from step to step."""

    def __init__(
        self, config: EngineConfig, device: torch.device, kv_block_bytes: int, num_blocks: int
    ):
        assert config.max_model_len is not None  # resolved by EngineConfig
        self.max_model_len = config.max_model_len
        self.block_size = config.block_size
        self.device = device
        self.dtype = config.torch_dtype
        self.longrope_original = config.model_config.longrope_original
        self.paged = config.attention_backend == "triton"  # the Triton paged-attention kernels
        self.token_bytes = kv_block_bytes // self.block_size
        # Decode attention on the CPU keeps each sequence's keys and values between steps
        # (decode_buffers.py), at most as many bytes as the cache itself. Not on CUDA: there
        # the cache already fills the memory, and a paged-attention kernel is the way.
        keep = num_blocks * kv_block_bytes if device.type == "cpu" and not self.paged else 0
        self.decode_buffers = DecodeBufferPlanner(self.block_size, self.token_bytes, keep)
        self.staging = Staging(step_staging_bytes(config), device)

    def upload(self, inputs: ForwardInputs) -> DeviceInputs:
        """A step's host inputs on the device, in one copy; a decode part on the torch
        attention backend gets its masks from the uploaded lengths."""
        host = [self.tensor(inputs.input_ids), self.tensor(inputs.positions)]
        host.append(self.tensor(inputs.rows))
        context: dict[int, torch.Tensor] = {}
        _collect(inputs.ctx, context)
        uploaded = self.staging.upload([*host, *context.values()])
        on_device = dict(zip(context, uploaded[len(host) :], strict=True))
        ctx: ForwardContext = _replace(inputs.ctx, on_device)
        if ctx.context_lens is not None and ctx.decode_groups is not None:
            ctx.decode_groups = self._with_masks(ctx.decode_groups, ctx.context_lens)
        return DeviceInputs(ctx, *uploaded[: len(host)])

    def build(self, batch: ScheduledBatch) -> BatchInputs:
        """An eager step's inputs: the prefill chunks, then the decodes."""
        step = BatchInputs(ForwardInputs(ForwardContext(slot_mapping=self.tensor([]))))
        slots: list[int] = []
        if self.paged:
            step.forward.ctx.paged = self._paged_prefill(batch.prefills)
        for seq, n in batch.prefills:
            self._add_prefill(step, slots, seq, n)
        if batch.decodes:
            self._add_decodes(step, slots, batch.decodes)
        elif not self.paged:  # the buffers of sequences gone since the last decode go
            step.forward.ctx.decode_plan = self.decode_buffers.release()
        step.forward.ctx.slot_mapping = self.tensor(slots)
        return step

    def decode_rows(self, seqs: list[Sequence]) -> DecodeRows:
        """A decode step's inputs as the graphs take them, in the sequences' order."""
        return DecodeRows(
            token_ids=[seq.last_token_id for seq in seqs],
            positions=[self.positions(seq, len(seq) - 1, 1)[0] for seq in seqs],
            slots=[self.slot(seq, len(seq) - 1) for seq in seqs],
            lora_slots=[seq.lora_slot for seq in seqs],
            tables=[seq.block_table for seq in seqs],
            context_lens=[len(seq) for seq in seqs],
        )

    def positions(self, seq: Sequence, start: int, n: int) -> range:
        """The rotary table rows of a sequence's tokens start..start+n-1: their positions,
        past the short half of a LongRoPE table once the sequence rotates with the long
        factors (block_manager.long_rope)."""
        if uses_long_factors(len(seq), self.longrope_original):
            start += self.max_model_len
        return range(start, start + n)

    def slot(self, seq: Sequence, position: int) -> int:
        """The KV-cache slot a sequence's token at `position` is written to."""
        return (
            seq.block_table[position // self.block_size] * self.block_size
            + position % self.block_size
        )

    @staticmethod
    def tensor(
        values: SequenceOf[int] | SequenceOf[SequenceOf[int]],
        dtype: torch.dtype = torch.long,
    ) -> torch.Tensor:
        """Host values as a host tensor (`upload` takes them to the device)."""
        return torch.tensor(values, dtype=dtype)

    def _add_prefill(self, step: BatchInputs, slots: list[int], seq: Sequence, n: int) -> None:
        """A chunk of n tokens from the sequence's first uncomputed one, and the rows of its
        logits: prompt logprobs' if asked for, the last token's if the prompt ends here."""
        fwd, ctx = step.forward, step.forward.ctx
        start, row = seq.num_computed_tokens, len(fwd.input_ids)
        fwd.input_ids.extend(seq.token_ids[start : start + n])
        fwd.positions.extend(self.positions(seq, start, n))
        slots.extend(self.slot(seq, i) for i in range(start, start + n))
        fwd.lora_slots.extend([seq.lora_slot] * n)
        ctx.cu_seqlens.append(ctx.cu_seqlens[-1] + n)
        ctx.context_starts.append(start)
        ctx.prefill_block_tables.append(
            self.tensor(seq.block_table[: -(-(start + n) // self.block_size)])
            if start and not self.paged
            else None
        )
        first, wanted = _prompt_positions(seq, start, n)
        if wanted:
            step.prompt_spans.append((seq, first, len(fwd.rows), wanted))
            fwd.rows.extend(range(row + first - start, row + first - start + wanted))
        if start + n == len(seq):
            step.samplers.append(seq)
            step.sample_at.append(len(fwd.rows))
            fwd.rows.append(row + n - 1)

    def _add_decodes(self, step: BatchInputs, slots: list[int], seqs: list[Sequence]) -> None:
        """The newest token of each decoding sequence, fed longest first."""
        fwd = step.forward
        decode_rows = self._prepare_decode(seqs, fwd.ctx, len(fwd.input_ids))
        order = sorted(range(len(seqs)), key=lambda i: decode_rows[i])
        decodes = [seqs[i] for i in order]
        fwd.input_ids.extend(seq.last_token_id for seq in decodes)
        for seq in decodes:
            fwd.positions.extend(self.positions(seq, len(seq) - 1, 1))
        slots.extend(self.slot(seq, len(seq) - 1) for seq in decodes)
        fwd.lora_slots.extend(seq.lora_slot for seq in decodes)
        step.samplers.extend(seqs)
        step.sample_at.extend(range(len(fwd.rows), len(fwd.rows) + len(decode_rows)))
        fwd.rows.extend(decode_rows)

    def _prepare_decode(self, seqs: list[Sequence], ctx: ForwardContext, offset: int) -> list[int]:
        """Set up the decode part of a step: the newest token of each sequence, attending over
        all the sequence's blocks, in groups of similar lengths that attend as one call each:
        the kept buffers' on the CPU, else groups of the rows sorted longest first, so none
        reads the padding of much longer ones. Returns each sequence's row in the step
        (`offset` is where the part starts)."""
        planned = None if self.paged else self.decode_buffers.plan(seqs)
        if planned is None:
            ordered = sorted(seqs, key=len, reverse=True)
            bounds = _length_groups([len(seq) for seq in ordered])
            groups = [DecodeGroup(start, end, 0, start, width) for start, end, width in bounds]
        else:
            ordered, groups, ctx.decode_plan = planned
        row_of = {id(seq): offset + row for row, seq in enumerate(ordered)}
        lengths = [len(seq) for seq in ordered]
        tables = _padded_tables([seq.block_table for seq in ordered])
        if ctx.paged is not None:
            ctx.paged.decode_tables = self.tensor(tables, torch.int32)
            ctx.paged.context_lens = self.tensor(lengths, torch.int32)
            ctx.block_tables = ctx.paged.decode_tables  # marks the step as having decodes
        else:
            ctx.decode_groups = groups
            ctx.block_tables = self.tensor(tables)
            ctx.context_lens = self.tensor(lengths)  # its masks are made on the device (upload)
        return [row_of[id(seq)] for seq in seqs]

    def _paged_prefill(self, prefills: list[tuple[Sequence, int]]) -> PagedStep:
        """The prefill chunks' tables and bounds as the paged kernels read them."""
        step = PagedStep()
        if not prefills:
            return step
        starts = [seq.num_computed_tokens for seq, _ in prefills]
        step.prefill_tables = self.tensor(
            _padded_tables([seq.block_table for seq, _ in prefills]), torch.int32
        )
        step.cu_seqlens_q = self.tensor(
            [0, *itertools.accumulate(n for _, n in prefills)], torch.int32
        )
        step.context_starts = self.tensor(starts, torch.int32)
        step.max_query_len = max(n for _, n in prefills)
        return step

    def _with_masks(self, groups: list[DecodeGroup], lengths: torch.Tensor) -> list[DecodeGroup]:
        """The decode groups with their additive masks, made on the device from the
        uploaded lengths."""
        span = torch.arange(max(g.width for g in groups), device=self.device)
        hidden = span[None, :] >= lengths[:, None]  # beyond a row's own tokens
        mask = torch.zeros(hidden.shape, dtype=self.dtype, device=self.device)
        mask = mask.masked_fill_(hidden, float("-inf"))[:, None, None, :]
        return [dataclasses.replace(g, mask=mask[g.start : g.end, :, :, : g.width]) for g in groups]


def _collect(value: Any, found: dict[int, torch.Tensor]) -> None:
    """Every tensor in a context (its fields, lists, tuples, paged step), once each."""
    if isinstance(value, torch.Tensor):
        found.setdefault(id(value), value)
    elif isinstance(value, list | tuple):
        for v in value:
            _collect(v, found)
    elif isinstance(value, ForwardContext | PagedStep):
        for f in dataclasses.fields(value):
            _collect(getattr(value, f.name), found)


def _replace(value: Any, uploaded: dict[int, torch.Tensor]) -> Any:
    """`value` with each collected tensor swapped for its upload (a new context)."""
    if isinstance(value, torch.Tensor):
        return uploaded[id(value)]
    if isinstance(value, list):
        return [_replace(v, uploaded) for v in value]
    if isinstance(value, tuple):
        return tuple(_replace(v, uploaded) for v in value)
    if isinstance(value, ForwardContext | PagedStep):
        names = [f.name for f in dataclasses.fields(value)]
        return type(value)(**{name: _replace(getattr(value, name), uploaded) for name in names})
    if isinstance(value, dict):  # the window masks and append rows, made on first use: none yet
        return {}
    return value


def _prompt_positions(seq: Sequence, start: int, n: int) -> tuple[int, int]:
    """(first, count) of the positions in a chunk whose logits give a prompt token its
    logprob and have not yet (a recomputed sequence keeps those it has); none unless the
    sequence asked for prompt logprobs."""
    if seq.params.prompt_logprobs is None:
        return start, 0
    first = max(start, len(seq.prompt_logprobs) - 1)
    return first, max(0, min(start + n, seq.num_prompt_tokens - 1) - first)


def _length_groups(lengths: list[int], max_groups: int = 4) -> list[tuple[int, int, int]]:
    """Split rows sorted by length (longest first) into (start, end, width) groups, starting
    a new group where a sequence is under 3/4 of its group's longest."""
    groups = [(0, lengths[0])]  # (start, width)
    for row, n in enumerate(lengths):
        if n * 4 < groups[-1][1] * 3 and len(groups) < max_groups:
            groups.append((row, n))
    ends = [start for start, _ in groups[1:]] + [len(lengths)]
    return [(start, end, width) for (start, width), end in zip(groups, ends, strict=True)]


def _padded_tables(tables: list[list[int]]) -> list[list[int]]:
    """Block tables as one rectangle, short rows padded with block 0 (never read)."""
    width = max(len(table) for table in tables)
    return [table + [0] * (width - len(table)) for table in tables]
