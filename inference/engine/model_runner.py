"""Turns a scheduled batch into tensors, runs the model, and samples the next token of each
sequence that fed its last uncomputed token (a prefill chunk short of that samples nothing)."""

import copy
import logging
import os
from dataclasses import dataclass

import torch

from .config import EngineConfig
from .cuda_graphs import Capture, CudaGraphCapture, DecodeGraphs, graph_pool_estimate
from .errors import ConfigError
from .kernel_warmup import compile_kernels
from .kv_cache import allocate_kv_cache, kv_cache_budget, slot_rows
from .lora.slots import LoRASlots
from .memory_pool import CPU_DEFAULT_SLOTS, PoolLayout, pages_per_slot, plan_slots
from .model.attention import Attention
from .model.context import ForwardContext, LoRAStep, SlotRows, forward_context
from .model.decoder import CausalLM
from .model.loader import load_weights
from .model.quantized_linear import weight_bytes
from .model_inputs import ForwardInputs, InputBuilder
from .parallel.group import min_over_ranks
from .parallel.plan import ShardPlan
from .parallel_workers import SlotWrite, StepInputs, Workers
from .sampler import Sampler, SamplerOutput, prompt_logprobs
from .scheduler import ScheduledBatch
from .sequence import Sequence
from .utils import default_dtype

logger = logging.getLogger(__name__)


@dataclass
class KVCopies:
    """Decode keys and values the CPU attention copied, in tokens (a token's keys and
    values in every layer): from the cache into decode buffers (a sequence joining the
    decode batch, or every sequence each step when no buffers are kept), and within buffers
    that grew. The last step's, and the totals."""

    copied: int = 0
    moved: int = 0
    total_copied: int = 0
    total_moved: int = 0

    def count(self, layers: list[Attention]) -> None:
        self.copied = max((layer.decode_kv.copied_tokens for layer in layers), default=0)
        self.moved = max((layer.decode_kv.moved_tokens for layer in layers), default=0)
        self.total_copied += self.copied
        self.total_moved += self.moved


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
    (parallel_workers.py), whose runners `follow` each step it runs."""

    def __init__(self, config: EngineConfig, rank: int = 0):
        self.config = config
        self.rank = rank
        plan: ShardPlan | None = None
        self.workers: Workers | None = None
        self.page_moves: list[tuple[int, int]] = []  # rank 0: for the other ranks to repeat
        if config.tensor_parallel_size > 1:
            plan = ShardPlan(rank, config.tensor_parallel_size, config.model_config)
            if rank == 0:
                self.workers = Workers(config, ModelRunner)  # each worker builds its own
        try:
            self._build(plan)
        except BaseException:
            self.close()  # a runner that could not start takes its other ranks with it
            raise

    def _build(self, plan: ShardPlan | None) -> None:
        """The model (this rank's shard under a plan), its weights, the LoRA slots, the KV
        cache and, on CUDA, the decode graphs."""
        self._load_model(plan)
        # LoRA slots come before the KV cache: their scratch and arena leave the KV budget;
        # their rows are bound to the pool's pages once it exists.
        self.lora_slots = self._make_lora_slots()
        # every kernel variant compiles before the first step (and before /readyz answers)
        self.kernel_warmup = compile_kernels(self.config, self.device)
        if self.device.type == "cuda":
            self._warm_up()
        # Not under tensor parallelism: every rank would have to replay its graph in step.
        graphs_allowed = self.paged and not self.config.enforce_eager and plan is None
        self._allocate_kv_cache(plan, graphs_allowed)
        self.sampler = Sampler()
        self.graphs: DecodeGraphs | None = None
        self.graph_bytes = 0  # device memory the graphs and their buffers took at capture
        if graphs_allowed and self.device.type == "cuda":
            self.enable_graphs(CudaGraphCapture(self.device))

    def _load_model(self, plan: ShardPlan | None) -> None:
        config = self.config
        assert config.max_model_len is not None and config.max_num_batched_tokens is not None
        self.max_model_len = config.max_model_len  # resolved by EngineConfig
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.block_size = config.block_size
        self.device = torch.device(config.device)
        self.paged = config.attention_backend == "triton"  # the Triton paged-attention kernels
        mc = config.model_config
        with torch.device(self.device), default_dtype(config.torch_dtype):
            self.model = CausalLM(mc, max_positions=self.max_model_len, plan=plan).eval()
        load_weights(self.model, config.model)
        self.attention_layers = [m for m in self.model.modules() if isinstance(m, Attention)]
        self.kv_copies = KVCopies()
        self.weights_bytes, bf16_bytes = weight_bytes(self.model)
        scheme = mc.quantization
        logger.info(
            "weights take %.1f MiB%s (%s; %.1f MiB in bf16, %.2fx)",
            self.weights_bytes / 2**20,
            "" if plan is None else f" on rank {plan.rank}",
            "unquantized" if scheme is None else f"quantized {scheme.name}",
            bf16_bytes / 2**20,
            self.weights_bytes / max(bf16_bytes, 1),
        )

    def engine_info(self) -> dict[str, str | int | float | bool]:
        """The device and settings this engine was sized with: what a capacity plan for
        it starts from (the admin's Engines page sets one beside what the engine holds)."""
        c = self.config
        if self.device.type == "cuda":
            props = torch.cuda.get_device_properties(self.device)
            name, memory = props.name, props.total_memory
        else:
            name, memory = "cpu", os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return {
            "device_type": self.device.type,
            "device_name": name,
            "device_memory_bytes": memory,
            "dtype": c.dtype,
            "tensor_parallel_size": c.tensor_parallel_size,
            "block_size": c.block_size,
            "max_model_len": self.max_model_len,
            "max_num_seqs": c.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            # "": LoRA on, the slot count left to the pool; 0: LoRA off
            "max_loras": ("" if c.max_loras is None else c.max_loras) if c.enable_lora else 0,
            "reserve_lora_slots": c.reserve_lora_slots,
            "max_cpu_loras": c.max_cpu_loras or 0,
            "max_lora_rank": c.max_lora_rank,
            "kv_cache_bytes": c.kv_cache_bytes or 0,  # 0: unset, sized from memory
            "gpu_memory_utilization": c.gpu_memory_utilization,
            "enforce_eager": c.enforce_eager,
        }

    def _make_lora_slots(self) -> LoRASlots | None:
        config = self.config
        if not config.enable_lora:
            return None
        slots = LoRASlots(
            self.model,
            config.max_loras,
            config.max_lora_rank,
            max(self.max_num_batched_tokens, config.max_num_seqs),
            extra_bytes=config.lora_extra_bytes,
            max_saved_params=config.max_saved_module_params,
            deterministic=config.deterministic_kernels,
        )
        if self.workers is not None:
            slots.journal = []  # the other ranks repeat rank 0's slot writes
        return slots

    def _allocate_kv_cache(self, plan: ShardPlan | None, graphs_allowed: bool) -> None:
        """The pool of KV pages in what memory is left, the LoRA slots bound to its bottom
        pages (memory_pool.py), and the inputs builder that addresses it."""
        kv_config = self.config  # the cache's shape and budget are per rank: its KV heads
        if plan is not None:
            kv_config = copy.copy(self.config)
            kv_config.model_config = plan.local_config()
        page_bytes = kv_config.kv_block_bytes
        slots = self.lora_slots
        self.lora_bytes = slots.reserved_nbytes if slots is not None else 0
        k = pages_per_slot(slots.row_nbytes, page_bytes) if slots is not None else 0
        if plan is not None and slots is not None:  # the groups lie alike on every rank
            k = -min_over_ranks(-k, self.device)
        asked = self.config.max_loras if slots is not None else None
        assert self.config.max_cudagraph_capture_size is not None  # resolved by EngineConfig
        self.graph_estimate = graph_pool_estimate(
            self.config.model_config,
            self.config.torch_dtype,
            self.config.max_cudagraph_capture_size,
            -(-self.max_model_len // self.block_size),
        )
        # the graphs are captured after the cache: on CUDA, where the runner captures them,
        # the budget keeps room for their pool
        reserve = self.graph_estimate.total if graphs_allowed and self.device.type == "cuda" else 0
        budget = kv_cache_budget(
            kv_config,
            self.device,
            self.lora_bytes,
            graph_bytes=reserve,
            slot_bytes=(asked or CPU_DEFAULT_SLOTS) * k * page_bytes,
        )
        blocks = budget // page_bytes
        if plan is not None:  # every rank holds the same blocks: the fewest any can
            blocks = min_over_ranks(blocks, self.device)
        # Decode graphs pad their batches; the padding rows write into one block of their
        # own, the last, which the block manager never hands out.
        self.num_blocks = blocks - 1 if graphs_allowed else blocks
        if self.num_blocks < 1:
            raise ConfigError(
                f"the KV cache holds {blocks} block, and CUDA graphs reserve one for padding; "
                "raise kv_cache_bytes or set enforce_eager"
            )
        self.kv_cache = allocate_kv_cache(self.model, kv_config, blocks, self.device)
        self.pool = PoolLayout(self.num_blocks, 0, k)
        if slots is not None:
            assert self.config.max_cpu_loras is not None  # resolved by EngineConfig
            note = f"the memory budget of {budget} bytes"
            num_slots = plan_slots(self.num_blocks, k, asked, self.config.max_cpu_loras, note)
            self.pool = PoolLayout(self.num_blocks, num_slots, k)
            if self.kv_cache.dtype != slots.dtype:
                raise ConfigError(
                    f"the LoRA slots ({slots.dtype}) and the KV cache ({self.kv_cache.dtype}) "
                    f"must share the compute dtype to share one pool"
                )
            slots.bind(slot_rows(self.kv_cache, num_slots, k, slots.slot_numel))
            logger.info(
                "memory pool: %d pages of %.1f KiB; %d LoRA slots of %d pages each at its bottom",
                self.num_blocks,
                page_bytes / 1024,
                num_slots,
                k,
            )
        self.input_builder = InputBuilder(self.config, self.device, page_bytes, self.num_blocks)

    def copy_pages(self, moves: list[tuple[int, int]]) -> None:
        """Move KV blocks between pages (src, dst), in order: one contiguous copy a page, as
        the pool is block-major. Under tensor parallelism every rank repeats them first in
        the next step."""
        for src, dst in moves:
            self.kv_cache[dst].copy_(self.kv_cache[src])
        if self.workers is not None:
            self.page_moves.extend(moves)

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
            sampler=self.sampler,
        )
        self.graphs.capture_all()
        if cuda:
            torch.cuda.synchronize(self.device)
            self.graph_bytes = free_before - torch.cuda.mem_get_info(self.device)[0]
            self._log_graph_bytes()
        else:
            self.graph_bytes = self.graphs.buffers.nbytes

    def _log_graph_bytes(self) -> None:
        """The graphs' measured memory against the estimate the KV budget kept for them
        (when gpu_memory_utilization sizes it)."""
        estimate = self.graph_estimate.total
        measured = f"CUDA graphs took {self.graph_bytes / 2**20:.1f} MiB"
        if self.graph_bytes > estimate:
            logger.warning(
                "%s, beyond the %.1f MiB estimated and kept free for them: the device may "
                "run out of memory; lower gpu_memory_utilization or max_cudagraph_capture_size",
                measured,
                estimate / 2**20,
            )
        else:
            logger.info("%s (estimated %.1f MiB)", measured, estimate / 2**20)

    def _on_graphs(self, batch: ScheduledBatch) -> bool:
        return self.graphs is not None and self.graphs.takes(batch.decodes, bool(batch.prefills))

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> tuple[list[Sequence], SamplerOutput]:
        """Run one step: the sequences that sampled a token, and their tokens. Prompt
        logprobs are appended to their sequences on the way. Under tensor parallelism the
        whole step, up to its host sync, must finish within the workers' deadline."""
        if self.workers is None:
            return self._run(batch)
        with self.workers.watch_step():
            return self._run(batch)

    def _run(self, batch: ScheduledBatch) -> tuple[list[Sequence], SamplerOutput]:
        if self._on_graphs(batch):
            assert self.graphs is not None
            logits = self.graphs.forward(self.input_builder.decode_rows(batch.decodes))
            return batch.decodes, self.graphs.sample(batch.decodes, logits)
        step = self.compute_logits(batch)
        for seq, first_position, rows in step.prompt:
            prompt_logprobs(seq, first_position, rows)
        return step.samplers, self.sampler(step.logits, step.samplers)

    @torch.inference_mode()
    def compute_logits(self, batch: ScheduledBatch) -> StepLogits:
        if self._on_graphs(batch):  # a copy: the graphs' buffer changes with the next step
            assert self.graphs is not None
            logits = self.graphs.forward(self.input_builder.decode_rows(batch.decodes)).clone()
            return StepLogits(list(batch.decodes), logits, [])
        step = self.input_builder.build(batch)
        if self.workers is None:
            logits = self._forward(step.forward)
        else:
            logits = self._forward_all_ranks(step.forward)
        prompt = [(seq, first, logits[at : at + k]) for seq, first, at, k in step.prompt_spans]
        if step.sample_at != list(range(len(logits))):  # a decode step's rows are its samplers'
            logits = logits[step.sample_at]  # (an index list is one more upload)
        return StepLogits(step.samplers, logits, prompt)

    def _forward(self, inputs: ForwardInputs) -> torch.Tensor:
        """The logits (float32) of `inputs.rows` of the fed tokens, after one upload."""
        on_device = self.input_builder.upload(inputs)
        ctx = on_device.ctx
        ctx.lora = self._lora_step(inputs.lora_slots)
        with forward_context(ctx):
            hidden: torch.Tensor = self.model(on_device.input_ids, on_device.positions)
            if ctx.lora is not None:  # lm_head sees the sampled rows only
                ctx.lora_head = self._lora_head([inputs.lora_slots[r] for r in inputs.rows])
            logits = self.model.compute_logits(hidden[on_device.rows]).float()
        if not self.paged:
            self.kv_copies.count(self.attention_layers)
        return logits

    def _forward_all_ranks(self, inputs: ForwardInputs) -> torch.Tensor:
        """Rank 0's step under tensor parallelism: the host inputs to every rank (each
        uploads its own), then the forward they run together. A lost rank fails the step
        with RankFailedError."""
        assert self.workers is not None
        moves, self.page_moves = self.page_moves, []
        self.workers.send(StepInputs(inputs, self._slot_writes(), page_moves=moves))
        try:
            return self._forward(inputs)
        except RuntimeError as e:  # a collective failed: a rank died or timed out
            raise self.workers.failed(f"{type(e).__name__}: {e}") from e

    def _slot_writes(self) -> list[SlotWrite]:
        """The slot writes since the last step, for the other ranks to repeat."""
        if self.lora_slots is None or not self.lora_slots.journal:
            return []
        journal, self.lora_slots.journal = self.lora_slots.journal, []
        return [(slot, None if a is None else (a.request, a.path)) for slot, a in journal]

    @torch.inference_mode()
    def follow(self, inputs: StepInputs) -> None:
        """Ranks 1..N-1: run rank 0's step on this rank's shard (the logits are rank 0's)."""
        self._forward(inputs.forward)

    def move_pages(self, moves: list[tuple[int, int]]) -> None:
        """Ranks 1..N-1: repeat rank 0's block moves, before its slot writes."""
        for src, dst in moves:
            self.kv_cache[dst].copy_(self.kv_cache[src])

    def check_ranks(self) -> None:
        """Raise RankFailedError once a rank of a tensor-parallel engine is lost."""
        if self.workers is not None:
            self.workers.check()

    def close(self) -> None:
        if self.workers is not None:
            self.workers.close()
            self.workers = None

    def _lora_step(self, token_slots: list[int]) -> LoRAStep | None:
        return self.lora_slots.make_step(token_slots) if self.lora_slots is not None else None

    def _lora_head(self, row_slots: list[int]) -> SlotRows | None:
        return self.lora_slots.head_rows(row_slots) if self.lora_slots is not None else None

    @torch.inference_mode()
    def _warm_up(self) -> None:
        """One full-size prefill without a cache, so the KV budget can leave room for the
        activations of the largest step."""
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)

        def longs(values: list[int]) -> torch.Tensor:  # before the inputs builder exists
            return torch.tensor(values, dtype=torch.long, device=self.device)

        n, seq_len = self.max_num_batched_tokens, self.max_model_len
        cu = list(range(0, n, seq_len)) + [n]
        positions = torch.cat([torch.arange(e - s) for s, e in zip(cu[:-1], cu[1:], strict=True)])
        # every token on slot 0, so the LoRA scratch of the largest step is measured too
        ctx = ForwardContext(
            slot_mapping=longs([]),
            cu_seqlens=cu,
            context_starts=[0] * (len(cu) - 1),
            prefill_block_tables=[None] * (len(cu) - 1),
            lora=self._lora_step([0] * n),
        )
        with forward_context(ctx):
            hidden = self.model(longs([0] * n), positions.to(self.device))
            self.model.compute_logits(hidden[longs([e - 1 for e in cu[1:]])])
        torch.cuda.synchronize(self.device)
