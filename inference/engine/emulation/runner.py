"""The engine's runner on an emulated device. The host's part of each step is the engine's
own: the inputs of a paged-attention step built and uploaded as on a GPU, the scheduler's
batch as it comes. The device's part is a wait for the time the cost model gives that batch
on the named GPU, and the sampled tokens come from a cheap rule that depends on the sequence
alone, so an emulated engine's outputs repeat run to run. The pool's pages are the ones the
planner finds for the emulated model on that GPU (their count and accounting; no KV is kept)."""

import copy
import logging

import torch

from ..config import EngineConfig
from ..logprobs import TokenLogprob
from ..memory_pool import PoolLayout, plan_slots
from ..model.decoder import CausalLM
from ..model_inputs import InputBuilder
from ..planning.step_time import StepShape, StepTimeModel
from ..sampler import Sampler, SamplerOutput, prompt_logprobs
from ..scheduler import ScheduledBatch
from ..sequence import Sequence
from ..utils import default_dtype
from .device import EmulatedDevice
from .lora import EmulatedLoRASlots, meta_rows
from .target import EmulationTarget
from .tokens import rule_token

logger = logging.getLogger(__name__)


class EmulatedKVCopies:
    """No decode buffers on a GPU: nothing is copied between steps."""

    copied = moved = total_copied = total_moved = 0


class EmulatedModelRunner:
    workers = None  # the ranks are emulated in the step's time, not started

    def __init__(self, config: EngineConfig, end_token_ids: frozenset[int]):
        assert config.emulate_device is not None and config.emulate_model is not None
        assert config.max_model_len is not None and config.max_num_batched_tokens is not None
        self.config = config
        self.max_model_len = config.max_model_len
        self.target = EmulationTarget.resolve(config)
        plan = self.target.plan
        self.device = EmulatedDevice(self.target.device.name)
        self.cost = StepTimeModel(
            self.target.model, self.target.device, None, config.tensor_parallel_size
        )
        self.num_blocks = plan.kv_blocks
        self.page_bytes = plan.kv_bytes_per_token_per_gpu * config.block_size
        self.weights_bytes = plan.weights_bytes_per_gpu
        self.kv_copies = EmulatedKVCopies()
        self.lora_slots = self._make_lora_slots()
        self.pool = PoolLayout(self.num_blocks, 0, plan.pages_per_slot)
        if self.lora_slots is not None:
            assert config.max_cpu_loras is not None  # resolved by EngineConfig with LoRA on
            note = f"the emulated {plan.device}'s pool"
            num_slots = plan_slots(
                self.num_blocks, plan.pages_per_slot, config.max_loras, config.max_cpu_loras, note
            )
            self.pool = PoolLayout(self.num_blocks, num_slots, plan.pages_per_slot)
            self.lora_slots.bind(meta_rows(self.lora_slots, num_slots))
        self.vocab_size = config.model_config.vocab_size  # the served tokenizer's tokens
        self.end_token_ids = end_token_ids | frozenset(config.model_config.eos_token_ids)
        self.sampler = Sampler()
        paged = copy.copy(config)  # inputs as the paged kernels on a GPU take them
        paged.attention_backend = "triton"
        self.input_builder = InputBuilder(
            paged, torch.device("cpu"), self.page_bytes, self.num_blocks
        )
        logger.warning(
            "EMULATED DEVICE: %s on %s x%d (%s); no model runs, each step waits the time the "
            "cost model gives; %d KV pages of %d tokens, %d LoRA slots",
            self.target.model_name,
            self.target.device.name,
            config.tensor_parallel_size,
            plan.quantization,
            self.num_blocks,
            config.block_size,
            self.pool.num_slots,
        )

    def _make_lora_slots(self) -> EmulatedLoRASlots | None:
        """The served model's slot layout on the meta device (no weight of it is loaded)."""
        config = self.config
        if not config.enable_lora:
            return None
        with torch.device("meta"), default_dtype(torch.bfloat16):
            served = CausalLM(config.model_config, max_positions=self.max_model_len).eval()
        return EmulatedLoRASlots(
            served,
            config.max_loras,
            config.max_lora_rank,
            max(config.max_num_batched_tokens or 0, config.max_num_seqs),
            extra_bytes=config.lora_extra_bytes,
            max_saved_params=config.max_saved_module_params,
            clock=self.device,
            cost=self.cost,
        )

    def run(self, batch: ScheduledBatch) -> tuple[list[Sequence], SamplerOutput]:
        step = self.input_builder.build(batch)
        self.input_builder.upload(step.forward)
        ranks, lora_tokens = self._lora_step(step.forward.lora_slots, step.forward.rows)
        self.device.run(self.cost.step_seconds(step_shape(batch, ranks, lora_tokens)))
        for seq, first_position, _at, k in step.prompt_spans:
            prompt_logprobs(seq, first_position, torch.zeros(k, self.vocab_size))
        return step.samplers, self._sample(step.samplers)

    def _sample(self, seqs: list[Sequence]) -> SamplerOutput:
        """The rule's token for most; sequences under a grammar or asking for logprobs go
        through the real sampler over flat logits (the grammar's mask decides among them)."""
        tokens: list[int] = []
        logprobs: list[TokenLogprob | None] = []
        sampled = [i for i, seq in enumerate(seqs) if _needs_sampler(seq)]
        if sampled:
            flat = torch.zeros(len(sampled), self.vocab_size)
            out = self.sampler(flat, [seqs[i] for i in sampled])
            by_row = dict(zip(sampled, zip(out.token_ids, out.logprobs, strict=True), strict=True))
        for i, seq in enumerate(seqs):
            if i in sampled:
                token, logprob = by_row[i]
            else:
                token, logprob = rule_token(seq, self.vocab_size, self.end_token_ids), None
            tokens.append(token)
            logprobs.append(logprob)
        return SamplerOutput(tokens, logprobs)

    def engine_info(self) -> dict[str, str | int | float | bool]:
        c, target = self.config, self.target
        return {
            "device_type": "emulated",
            "device_name": target.device.name,
            "device_memory_bytes": target.device.memory_bytes,
            "emulated_model": target.model_name,
            "quantization": target.plan.quantization,
            "dtype": target.plan.dtype,
            "tensor_parallel_size": c.tensor_parallel_size,
            "block_size": c.block_size,
            "max_model_len": self.max_model_len,
            "max_num_seqs": c.max_num_seqs,
            "max_num_batched_tokens": c.max_num_batched_tokens or 0,
            "max_loras": self.pool.num_slots,
            "kv_cache_bytes": c.kv_cache_bytes or 0,
            "gpu_memory_utilization": c.gpu_memory_utilization,
        }

    def _lora_step(self, token_slots: list[int], rows: list[int]) -> tuple[tuple[int, ...], int]:
        """The step's LoRA metadata, built as for a GPU, and what the device computes of it."""
        slots = self.lora_slots
        if slots is None:
            return (), 0
        slots.make_step(token_slots)
        slots.head_rows([token_slots[r] for r in rows])
        return slots.step_ranks(token_slots)

    def copy_pages(self, moves: list[tuple[int, int]]) -> None:
        """The pool moving KV blocks out of an adapter's way: a read and a write of each page
        in device memory."""
        if moves:
            nbytes = 2 * len(moves) * self.page_bytes
            self.device.run(nbytes / self.cost.rates.hbm_bandwidth, step=False)

    def check_ranks(self) -> None:
        pass

    def close(self) -> None:
        pass


def step_shape(
    batch: ScheduledBatch, lora_ranks: tuple[int, ...] = (), lora_tokens: int = 0
) -> StepShape:
    """What the device computes in a step: each prefill chunk by the context it extends,
    each decode by the context it attends over, the adapters by their ranks."""
    return StepShape(
        prefills=tuple((seq.num_computed_tokens, n) for seq, n in batch.prefills),
        decode_contexts=tuple(len(seq) for seq in batch.decodes),
        lora_ranks=lora_ranks,
        lora_tokens=lora_tokens,
    )


def _needs_sampler(seq: Sequence) -> bool:
    return seq.grammar is not None or seq.params.logprobs is not None
