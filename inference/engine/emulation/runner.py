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
from ..errors import ConfigError
from ..memory_pool import PoolLayout
from ..model_inputs import InputBuilder
from ..planning.step_time import StepShape, StepTimeModel
from ..sampler import Sampler, SamplerOutput, prompt_logprobs
from ..scheduler import ScheduledBatch
from ..sequence import Sequence
from .device import EmulatedDevice
from .target import EmulationTarget
from .tokens import rule_token

logger = logging.getLogger(__name__)


class EmulatedKVCopies:
    """No decode buffers on a GPU: nothing is copied between steps."""

    copied = moved = total_copied = total_moved = 0


class EmulatedModelRunner:
    workers = None  # the ranks are emulated in the step's time, not started
    lora_slots = None

    def __init__(self, config: EngineConfig, end_token_ids: frozenset[int]):
        assert config.emulate_device is not None and config.emulate_model is not None
        assert config.max_model_len is not None and config.max_num_batched_tokens is not None
        if config.enable_lora:
            raise ConfigError("the emulated device serves the base model only; unset enable_lora")
        self.config = config
        self.max_model_len = config.max_model_len
        self.target = EmulationTarget.resolve(
            config.emulate_device,
            config.emulate_model,
            config.emulate_quantization,
            config.tensor_parallel_size,
            max_model_len=config.max_model_len,
            max_num_batched_tokens=config.max_num_batched_tokens,
            block_size=config.block_size,
            kv_cache_bytes=config.kv_cache_bytes,
            gpu_memory_utilization=config.gpu_memory_utilization,
        )
        plan = self.target.plan
        self.device = EmulatedDevice(self.target.device.name)
        self.cost = StepTimeModel(
            self.target.model,
            self.target.device,
            self.target.quantization,
            config.tensor_parallel_size,
        )
        self.num_blocks = plan.kv_blocks
        self.pool = PoolLayout(self.num_blocks, 0, 0)
        self.weights_bytes = plan.weights_bytes_per_gpu
        self.kv_copies = EmulatedKVCopies()
        self.vocab_size = config.model_config.vocab_size  # the served tokenizer's tokens
        self.end_token_ids = end_token_ids | frozenset(config.model_config.eos_token_ids)
        self.sampler = Sampler()
        paged = copy.copy(config)  # inputs as the paged kernels on a GPU take them
        paged.attention_backend = "triton"
        block_bytes = plan.kv_bytes_per_token_per_gpu * config.block_size
        self.input_builder = InputBuilder(
            paged, torch.device("cpu"), block_bytes, self.num_blocks
        )
        logger.warning(
            "EMULATED DEVICE: %s on %s x%d (%s); no model runs, each step waits the time the "
            "cost model gives; %d KV pages of %d tokens",
            self.target.model_name,
            self.target.device.name,
            config.tensor_parallel_size,
            plan.quantization,
            self.num_blocks,
            config.block_size,
        )

    def run(self, batch: ScheduledBatch) -> tuple[list[Sequence], SamplerOutput]:
        step = self.input_builder.build(batch)
        self.input_builder.upload(step.forward)
        self.device.run(self.cost.step_seconds(step_shape(batch)))
        for seq, first_position, _at, k in step.prompt_spans:
            prompt_logprobs(seq, first_position, torch.zeros(k, self.vocab_size))
        return step.samplers, self._sample(step.samplers)

    def _sample(self, seqs: list[Sequence]) -> SamplerOutput:
        """The rule's token for most; sequences under a grammar or asking for logprobs go
        through the real sampler over flat logits (the grammar's mask decides among them)."""
        tokens: list[int] = []
        logprobs: list = []
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
            "max_loras": 0,
            "kv_cache_bytes": c.kv_cache_bytes or 0,
            "gpu_memory_utilization": c.gpu_memory_utilization,
        }

    def check_ranks(self) -> None:
        pass

    def close(self) -> None:
        pass


def step_shape(batch: ScheduledBatch) -> StepShape:
    """What the device computes in a step: each prefill chunk by the context it extends,
    each decode by the context it attends over."""
    return StepShape(
        prefills=tuple((seq.num_computed_tokens, n) for seq, n in batch.prefills),
        decode_contexts=tuple(len(seq) for seq in batch.decodes),
    )


def _needs_sampler(seq: Sequence) -> bool:
    return seq.grammar is not None or seq.params.logprobs is not None
