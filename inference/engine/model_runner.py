"""Turns a scheduled batch into tensors, runs the model, and samples the next token of each
sequence that fed its last uncomputed token (a prefill chunk short of that samples nothing)."""

import copy
import itertools
from collections.abc import Sequence as SequenceOf
from dataclasses import dataclass

import torch

from .config import EngineConfig
from .cuda_graphs import Capture, CudaGraphCapture, DecodeGraphs, DecodeRows
from .errors import ConfigError
from .kv_cache import allocate_kv_cache, kv_cache_budget
from .lora.apply import LoRAStep, SlotRows
from .lora.slots import LoRASlots
from .model.context import ForwardContext, PagedStep, forward_context
from .model.decoder import CausalLM
from .model.loader import load_weights
from .model.rotary import uses_long_factors
from .parallel.group import min_over_ranks
from .parallel.plan import ShardPlan
from .parallel.workers import StepInputs, Workers, move_context
from .sampler import Sampler, SamplerOutput, prompt_logprobs
from .scheduler import ScheduledBatch
from .sequence import Sequence
from .utils import default_dtype


@dataclass
class StepLogits:
    """A step's logits (float32): one row per sequence that samples its next token (it fed
    its last uncomputed token), and, for sequences that asked for prompt logprobs, the rows
    of every prompt token they fed."""

    samplers: list[Sequence]
    logits: torch.Tensor  # [len(samplers), vocab]
    prompt: list[tuple[Sequence, int, torch.Tensor]]  # (seq, position of the first row, rows)


class ModelRunner:
    """With tensor_parallel_size N > 1, rank 0's runner starts the other N - 1 ranks
    (parallel/workers.py), whose runners `follow` each step it runs."""

    def __init__(self, config: EngineConfig, rank: int = 0):
        self.config = config
        self.rank = rank
        plan: ShardPlan | None = None
        self.workers: Workers | None = None
        if config.tensor_parallel_size > 1:
            plan = ShardPlan(rank, config.tensor_parallel_size, config.model_config)
            if rank == 0:
                self.workers = Workers(config)
        try:
            self._build(plan)
        except BaseException:
            self.close()  # a runner that could not start takes its other ranks with it
            raise

    def _build(self, plan: ShardPlan | None) -> None:
        """The model (this rank's shard under a plan), its weights, the LoRA slots, the KV
        cache and, on CUDA, the decode graphs."""
        config = self.config
        assert config.max_model_len is not None and config.max_num_batched_tokens is not None
        self.max_model_len = config.max_model_len  # resolved by EngineConfig
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.block_size = config.block_size
        self.device = torch.device(config.device)
        mc = config.model_config
        self.longrope_original = mc.longrope_original
        self.paged = config.attention_backend == "triton"  # the Triton paged-attention kernels
        with torch.device(self.device), default_dtype(config.torch_dtype):
            self.model = CausalLM(mc, max_positions=self.max_model_len, plan=plan).eval()
        load_weights(self.model, config.model)
        # the KV cache's shape and budget are per rank: this rank's KV heads
        self.kv_config = config
        if plan is not None:
            self.kv_config = copy.copy(config)
            self.kv_config.model_config = plan.local_config()
        # LoRA slots come before the KV cache: allocated once, their bytes leave the KV budget.
        self.lora_slots = (
            LoRASlots(
                self.model,
                config.max_loras,
                config.max_lora_rank,
                max(self.max_num_batched_tokens, config.max_num_seqs),
                extra_bytes=config.lora_extra_bytes,
                max_saved_params=config.max_saved_module_params,
            )
            if config.enable_lora
            else None
        )
        if self.lora_slots is not None and self.workers is not None:
            self.lora_slots.journal = []  # the other ranks repeat rank 0's slot writes
        if self.device.type == "cuda":
            self._warm_up()
        lora_bytes = self.lora_slots.nbytes if self.lora_slots is not None else 0
        kv_config = self.kv_config
        blocks = kv_cache_budget(kv_config, self.device, lora_bytes) // kv_config.kv_block_bytes
        if plan is not None:  # every rank holds the same blocks: the fewest any can
            blocks = min_over_ranks(blocks, self.device)
        # Decode graphs pad their batches; the padding rows write into one block of their
        # own, the last, which the block manager never hands out. Not under tensor
        # parallelism: every rank would have to replay its graph in step.
        graphs_allowed = self.paged and not config.enforce_eager and plan is None
        self.num_blocks = blocks - 1 if graphs_allowed else blocks
        if self.num_blocks < 1:
            raise ConfigError(
                f"the KV cache holds {blocks} block, and CUDA graphs reserve one for padding; "
                "raise kv_cache_bytes or set enforce_eager"
            )
        self.kv_cache = allocate_kv_cache(self.model, kv_config, blocks, self.device)
        self.sampler = Sampler()
        self.graphs: DecodeGraphs | None = None
        self.graph_bytes = 0  # device memory the graphs and their buffers took at capture
        if graphs_allowed and self.device.type == "cuda":
            self.enable_graphs(CudaGraphCapture(self.device))
        # Decode attention may keep a padded copy of the running batch's keys and values
        # (see Attention.decode_kv), at most as large as the cache itself. Not on CUDA: there
        # the cache already fills the memory, and a paged-attention kernel is the way.
        self.decode_buffer_bytes = (
            self.num_blocks * kv_config.kv_block_bytes if self.device.type == "cpu" else 0
        )
        self.decode_buffer_headroom = 64  # tokens to grow by before the buffers are rebuilt
        self._last_decode: list[tuple[Sequence, int]] = []  # (sequence, length) of the last decode
        self._buffer_len = 0

    @torch.inference_mode()
    def enable_graphs(self, capture: Capture) -> None:
        """Capture the decode graphs (after the KV cache exists: they write into it) and
        count the memory they took. On CUDA at start-up; tests pass `direct_capture`."""
        assert self.paged and not self.config.enforce_eager, "graphs need the paged kernels"
        assert self.config.max_cudagraph_capture_size is not None  # resolved by EngineConfig
        cuda = self.device.type == "cuda"
        if cuda:  # cached free blocks go back first, or capturing (which frees them) hides its cost
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            free_before = torch.cuda.mem_get_info(self.device)[0]
        self.graphs = DecodeGraphs(
            self.model,
            self.lora_slots,
            largest=self.config.max_cudagraph_capture_size,
            max_blocks=-(-self.max_model_len // self.block_size),
            pad_block=self.num_blocks,
            block_size=self.block_size,
            capture=capture,
        )
        self.graphs.capture_all()
        if cuda:
            torch.cuda.synchronize(self.device)
            self.graph_bytes = free_before - torch.cuda.mem_get_info(self.device)[0]
        else:
            self.graph_bytes = self.graphs.buffers.nbytes

    def _on_graphs(self, batch: ScheduledBatch) -> bool:
        return self.graphs is not None and self.graphs.takes(batch.decodes, bool(batch.prefills))

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> tuple[list[Sequence], SamplerOutput]:
        """Run one step: the sequences that sampled a token, and their tokens. Prompt
        logprobs are appended to their sequences on the way."""
        if self._on_graphs(batch):
            assert self.graphs is not None
            logits = self.graphs.forward(self._decode_rows(batch.decodes))
            return batch.decodes, self.graphs.sample(batch.decodes, logits)
        step = self.compute_logits(batch)
        for seq, first_position, rows in step.prompt:
            prompt_logprobs(seq, first_position, rows)
        return step.samplers, self.sampler(step.logits, step.samplers)

    @torch.inference_mode()
    def compute_logits(self, batch: ScheduledBatch) -> StepLogits:
        if self._on_graphs(batch):  # a copy: the graphs' buffer changes with the next step
            assert self.graphs is not None
            logits = self.graphs.forward(self._decode_rows(batch.decodes)).clone()
            return StepLogits(list(batch.decodes), logits, [])
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        lora_slots: list[int] = []
        ctx = ForwardContext(slot_mapping=self._tensor([]))
        rows: list[int] = []  # hidden rows to turn into logits
        sample_at: list[int] = []  # where in `rows` each sampler's row is
        samplers: list[Sequence] = []
        prompt_spans: list[tuple[Sequence, int, int, int]] = []  # seq, position, first row, rows
        if self.paged:
            ctx.paged = self._paged_prefill(batch.prefills)
        for seq, n in batch.prefills:
            start, row = seq.num_computed_tokens, len(input_ids)
            input_ids.extend(seq.token_ids[start : start + n])
            positions.extend(self._positions(seq, start, n))
            slots.extend(self._slot(seq, i) for i in range(start, start + n))
            lora_slots.extend([seq.lora_slot] * n)
            ctx.cu_seqlens.append(ctx.cu_seqlens[-1] + n)
            ctx.context_starts.append(start)
            ctx.prefill_block_tables.append(
                self._tensor(seq.block_table[: -(-(start + n) // self.block_size)])
                if start and not self.paged
                else None
            )
            first, wanted = _prompt_positions(seq, start, n)
            if wanted:
                prompt_spans.append((seq, first, len(rows), wanted))
                rows.extend(range(row + first - start, row + first - start + wanted))
            if start + n == len(seq):
                samplers.append(seq)
                sample_at.append(len(rows))
                rows.append(row + n - 1)
        if batch.decodes:
            decode_rows = self._prepare_decode(batch.decodes, ctx, len(input_ids))
            order = sorted(range(len(batch.decodes)), key=lambda i: decode_rows[i])
            decodes = [batch.decodes[i] for i in order]
            input_ids.extend(seq.last_token_id for seq in decodes)
            for seq in decodes:
                positions.extend(self._positions(seq, len(seq) - 1, 1))
            slots.extend(self._slot(seq, len(seq) - 1) for seq in decodes)
            lora_slots.extend(seq.lora_slot for seq in decodes)
            samplers.extend(batch.decodes)
            sample_at.extend(range(len(rows), len(rows) + len(decode_rows)))
            rows.extend(decode_rows)
        else:
            self._last_decode = []  # the next decode batch is new
        ctx.slot_mapping = self._tensor(slots)
        if self.workers is None:
            logits = self._forward(ctx, input_ids, positions, rows, lora_slots)
        else:
            logits = self._forward_all_ranks(ctx, input_ids, positions, rows, lora_slots)
        prompt = [(seq, first, logits[at : at + k]) for seq, first, at, k in prompt_spans]
        return StepLogits(samplers, logits[sample_at], prompt)

    def _forward(
        self,
        ctx: ForwardContext,
        input_ids: list[int],
        positions: list[int],
        rows: list[int],
        lora_slots: list[int],
    ) -> torch.Tensor:
        """The logits (float32) of `rows` of the fed tokens."""
        ctx.lora = self._lora_step(lora_slots)
        with forward_context(ctx):
            hidden: torch.Tensor = self.model(self._tensor(input_ids), self._tensor(positions))
            if ctx.lora is not None:  # lm_head sees the sampled rows only
                ctx.lora_head = self._lora_head([lora_slots[r] for r in rows])
            logits = self.model.compute_logits(hidden[self._tensor(rows)]).float()
        return logits

    def _forward_all_ranks(
        self,
        ctx: ForwardContext,
        input_ids: list[int],
        positions: list[int],
        rows: list[int],
        lora_slots: list[int],
    ) -> torch.Tensor:
        """Rank 0's step under tensor parallelism: the inputs to every rank, then the
        forward they run together. A lost rank fails the step with RankFailedError."""
        assert self.workers is not None
        writes = []
        if self.lora_slots is not None and self.lora_slots.journal:
            journal, self.lora_slots.journal = self.lora_slots.journal, []
            writes = [(slot, None if a is None else (a.request, a.path)) for slot, a in journal]
        cpu = torch.device("cpu")
        self.workers.send(
            StepInputs(input_ids, positions, rows, lora_slots, move_context(ctx, cpu), writes)
        )
        try:
            return self._forward(ctx, input_ids, positions, rows, lora_slots)
        except RuntimeError as e:  # a collective failed: a rank died or timed out
            raise self.workers.failed(f"{type(e).__name__}: {e}") from e

    @torch.inference_mode()
    def follow(self, inputs: StepInputs) -> None:
        """Ranks 1..N-1: run rank 0's step on this rank's shard (the logits are rank 0's)."""
        ctx = move_context(inputs.ctx, self.device)
        self._forward(ctx, inputs.input_ids, inputs.positions, inputs.rows, inputs.lora_slots)

    def check_ranks(self) -> None:
        """Raise RankFailedError once a rank of a tensor-parallel engine is lost."""
        if self.workers is not None:
            self.workers.check()

    def close(self) -> None:
        if self.workers is not None:
            self.workers.close()
            self.workers = None

    def _decode_rows(self, seqs: list[Sequence]) -> DecodeRows:
        """A decode step's inputs as the graphs take them, in the sequences' order."""
        return DecodeRows(
            token_ids=[seq.last_token_id for seq in seqs],
            positions=[self._positions(seq, len(seq) - 1, 1)[0] for seq in seqs],
            slots=[self._slot(seq, len(seq) - 1) for seq in seqs],
            lora_slots=[seq.lora_slot for seq in seqs],
            tables=[seq.block_table for seq in seqs],
            context_lens=[len(seq) for seq in seqs],
        )

    def _prepare_decode(self, seqs: list[Sequence], ctx: ForwardContext, offset: int) -> list[int]:
        """Set up the decode part of a step: the newest token of each sequence, attending over
        all the sequence's blocks. The part runs longest first, so sequences of similar length
        can attend as one group without reading the padding of much longer ones. Returns each
        sequence's row in the step (`offset` is where the part starts)."""
        order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
        rows = [0] * len(seqs)
        for row, i in enumerate(order):
            rows[i] = offset + row
        seqs = [seqs[i] for i in order]
        lengths = [len(seq) for seq in seqs]
        tables = _padded_tables([seq.block_table for seq in seqs])
        if ctx.paged is not None:
            ctx.paged.decode_tables = self._tensor(tables, torch.int32)
            ctx.paged.context_lens = self._tensor(lengths, torch.int32)
            ctx.block_tables = ctx.paged.decode_tables  # marks the step as having decodes
            return rows
        ctx.decode_buffer_len, ctx.refresh_decode_buffers = self._decode_buffers(seqs)
        ctx.block_tables = self._tensor(tables)
        ctx.context_lens = self._tensor(lengths)
        ctx.decode_groups = self._decode_groups(lengths)
        return rows

    def _paged_prefill(self, prefills: list[tuple[Sequence, int]]) -> PagedStep:
        """The prefill chunks' tables and bounds as the paged kernels read them."""
        step = PagedStep()
        if not prefills:
            return step
        starts = [seq.num_computed_tokens for seq, _ in prefills]
        step.prefill_tables = self._tensor(
            _padded_tables([seq.block_table for seq, _ in prefills]), torch.int32
        )
        step.cu_seqlens_q = self._tensor(
            [0, *itertools.accumulate(n for _, n in prefills)], torch.int32
        )
        step.context_starts = self._tensor(starts, torch.int32)
        step.max_query_len = max(n for _, n in prefills)
        return step

    def _decode_groups(self, lengths: list[int]) -> list[tuple[int, int, torch.Tensor]]:
        """Rows (longest first) that attend in one call, each group with its additive mask."""
        span = torch.arange(lengths[0], device=self.device)
        hidden = span[None, :] >= self._tensor(lengths)[:, None]  # beyond a row's own tokens
        mask = torch.zeros(hidden.shape, dtype=self.config.torch_dtype, device=self.device)
        mask = mask.masked_fill_(hidden, float("-inf"))[:, None, None, :]
        return [(s, e, mask[s:e, :, :, :width]) for s, e, width in _length_groups(lengths)]

    def _decode_buffers(self, seqs: list[Sequence]) -> tuple[int | None, bool]:
        """(length of the decode buffers or None for none, whether to rebuild them). They are
        kept while the batch is the previous decode batch, each sequence one token longer."""
        previous, self._last_decode = self._last_decode, [(seq, len(seq)) for seq in seqs]
        longest = max(len(seq) for seq in seqs)
        same_batch = len(previous) == len(seqs) and all(
            seq is old and len(seq) == n + 1 for seq, (old, n) in zip(seqs, previous, strict=True)
        )
        if same_batch and longest <= self._buffer_len:
            return self._buffer_len, False
        # room to grow for a while before the next rebuild
        self._buffer_len = (
            -(-(longest + self.decode_buffer_headroom) // self.block_size) * self.block_size
        )
        token_bytes = self.kv_config.kv_block_bytes // self.block_size
        if len(seqs) * self._buffer_len * token_bytes > self.decode_buffer_bytes:
            self._last_decode = []
            return None, True
        return self._buffer_len, True

    def _lora_step(self, token_slots: list[int]) -> LoRAStep | None:
        return self.lora_slots.make_step(token_slots) if self.lora_slots is not None else None

    def _lora_head(self, row_slots: list[int]) -> SlotRows | None:
        return self.lora_slots.head_rows(row_slots) if self.lora_slots is not None else None

    def _positions(self, seq: Sequence, start: int, n: int) -> range:
        """The rotary table rows of a sequence's tokens start..start+n-1: their positions,
        past the short half of a LongRoPE table once the sequence rotates with the long
        factors (block_manager.long_rope)."""
        if uses_long_factors(len(seq), self.longrope_original):
            start += self.max_model_len
        return range(start, start + n)

    def _slot(self, seq: Sequence, position: int) -> int:
        return (
            seq.block_table[position // self.block_size] * self.block_size
            + position % self.block_size
        )

    def _tensor(
        self,
        values: SequenceOf[int] | SequenceOf[SequenceOf[int]],
        dtype: torch.dtype = torch.long,
    ) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=self.device)

    @torch.inference_mode()
    def _warm_up(self) -> None:
        """One full-size prefill without a cache, so the KV budget can leave room for the
        activations of the largest step."""
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        n, seq_len = self.max_num_batched_tokens, self.max_model_len
        cu = list(range(0, n, seq_len)) + [n]
        positions = torch.cat([torch.arange(e - s) for s, e in zip(cu[:-1], cu[1:], strict=True)])
        # every token on slot 0, so the LoRA scratch of the largest step is measured too
        ctx = ForwardContext(
            slot_mapping=self._tensor([]),
            cu_seqlens=cu,
            context_starts=[0] * (len(cu) - 1),
            prefill_block_tables=[None] * (len(cu) - 1),
            lora=self._lora_step([0] * n),
        )
        with forward_context(ctx):
            hidden = self.model(self._tensor([0] * n), positions.to(self.device))
            self.model.compute_logits(hidden[self._tensor([e - 1 for e in cu[1:]])])
        torch.cuda.synchronize(self.device)


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
