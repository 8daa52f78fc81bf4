"""Engine configuration: everything fixed at start-up, checked before any weight loads."""

from dataclasses import dataclass, field
from pathlib import Path

import torch

from inference.kernels.backend import attention_backend

from .errors import ConfigError
from .lora.peft_rules import DEFAULT_MAX_SAVED_MODULE_PARAMS
from .model_config import ModelConfig
from .parallel.group import timeout_seconds
from .parallel.plan import check_shardable
from .prefill_cost import PrefillCost

# ModelConfig too: callers that read a model's shape (the registry) import it from here
__all__ = ["DTYPES", "EngineConfig", "ModelConfig"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# The host cache's adapters when the operator sets neither max_loras nor max_cpu_loras;
# the pool then makes at most this many slots.
DEFAULT_CPU_LORAS = 32


def kv_bytes_per_token(mc: ModelConfig, itemsize: int) -> int:
    """Bytes one token's keys and values take across all layers (a rank's share when `mc`
    is one rank's shape); the KV cache and the capacity planner both size from this."""
    return 2 * mc.num_layers * mc.num_kv_heads * mc.head_dim * itemsize


def default_max_cpu_loras(max_loras: int | None) -> int:
    """Host memory caches a few times what the device slots hold, and never too few; with
    the slot count left to the pool, as many as the pool may make slots."""
    if max_loras is None or isinstance(max_loras, bool) or not isinstance(max_loras, int):
        return DEFAULT_CPU_LORAS
    return max(4 * max_loras, 16)


def default_batch_tokens(
    device_type: str, chunked_prefill: bool, max_model_len: int, max_num_seqs: int
) -> int:
    """max_num_batched_tokens when unset: with chunked prefill 128 on cpu and 8192 on cuda;
    without, room for the longest prompt in one step. On cpu a step's time grows with every
    token (counted at its cost, prefill_cost.py) and a request that arrives waits for the
    step under way: 128 keeps that wait near a short chat's own prefill."""
    if not chunked_prefill:
        return max(max_model_len, 2048)
    return max(8192 if device_type == "cuda" else 128, max_num_seqs)


@dataclass
class EngineConfig:
    """Everything fixed at start-up. Reads the model's config.json on creation, so a bad
    folder or a value that cannot work fails here, before any weight is loaded."""

    model: str | Path
    device: str = "auto"  # "auto": cuda when available, else cpu
    dtype: str = "auto"  # "auto": float32 on cpu, bfloat16 (or float16) on cuda
    max_model_len: int | None = None  # prompt + completion tokens; default: the model's
    max_num_seqs: int = 128
    # tokens per step, decodes and prefill chunks together (a prefill token counted at its
    # cost, prefill_cost_context). Default: with chunked prefill 128 on cpu (a step stays
    # short) and 8192 on cuda; without, max(max_model_len, 2048)
    max_num_batched_tokens: int | None = None
    # the most tokens background work (the quality gate's scoring) feeds in a step; it
    # never joins a step of tenants' decodes alone (scheduler.py). 0: no such budget.
    # Default: 32 on cpu, 256 on cuda (_check_background_budget); at most the step's budget
    background_tokens_per_step: int | None = None
    # tenants (fairness keys) share a step's prefill tokens equally, and beside another
    # tenant's short prompt (shorter, and within its equal share of the step) a prompt feeds
    # at most this many (scheduler.py, prefill_share.py). 0: no such cap, the equal shares
    # only. Default: 16 on cpu, 256 on cuda (_check_prefill_share)
    long_prefill_token_threshold: int | None = None
    # the most prompts left part-way through their prefill at once; a waiting prompt that
    # would start part-way waits while that many are (one that finishes in its step never)
    max_num_partial_prefills: int = 4
    # with chunked prefill, a prefill token counts 1 + its position / this in the step's
    # budget: where its attention costs as much as its linear layers, it counts double, so
    # a long prompt's chunks shrink as it goes and its steps stay as short as the first
    # (prefill_cost.py). 0: every token counts 1. Default: the model's balance point
    # (ModelConfig.attention_cost_context) on cpu, 0 on cuda
    prefill_cost_context: int | None = None
    block_size: int = 16
    # reuse the KV blocks of prompt prefixes already computed (per adapter)
    enable_prefix_caching: bool = True
    # prefill a long prompt over several steps, alongside the running decodes
    enable_chunked_prefill: bool = True
    # the pool of KV pages and LoRA slots, plus the LoRA scratch and extras. Unset: on cpu
    # 512 MiB of cache (at least one max_model_len sequence) plus max_loras' slots (4 when
    # unset), on cuda a share of device memory (kv_cache.py)
    kv_cache_bytes: int | None = None
    gpu_memory_utilization: float = 0.9  # on cuda without kv_cache_bytes: share of device memory
    seed: int = 0  # seeds requests that give no seed of their own
    # "auto": Triton paged attention on CUDA, the torch reference on CPU; "torch", "triton"
    attention_backend: str = "auto"
    # LoRA: device slots (adapters in one batch), host cache entries, largest rank served.
    # The slots' pages are part of the KV cache's pool (memory_pool.py); max_loras bounds
    # their count, None lets the pool decide (as many as it holds, at most 32 and
    # max_cpu_loras)
    enable_lora: bool = False
    max_loras: int | None = None
    # True: the max_loras slots' pages belong to the adapters from the start and never
    # serve as KV blocks: the fixed split of engines before the pool (vLLM's), a KV capacity
    # that never moves, paid for with the memory of every slot no adapter uses
    reserve_lora_slots: bool = False
    max_cpu_loras: int | None = None  # default: max(4 * max_loras, 16), 32 without max_loras
    max_lora_rank: int = 16
    # an adapter's whole embed_tokens / lm_head copy (modules_to_save) is served up to this
    max_saved_module_params: int = DEFAULT_MAX_SAVED_MODULE_PARAMS
    # device bytes for DoRA scales, LoRA on the heads and saved heads, shared by the slots'
    # adapters that have them; default: room for every slot (lora/slots.py)
    lora_extra_bytes: int | None = None
    # True: the LoRA shrinks never split a reduction over programs (split-K partial sums
    # meet by fp32 atomics in an order that changes run to run), so the same batches give
    # the same bits on every run; costs small decode batches some latency
    deterministic_kernels: bool = False
    # decode steps replay CUDA graphs (cuda_graphs.py) on CUDA with the Triton attention
    # backend; True runs every step eagerly (vLLM's name), for debugging
    enforce_eager: bool = False
    # the largest decode batch a graph is captured for; larger batches run eagerly.
    # Default: min(max_num_seqs, 256)
    max_cudagraph_capture_size: int | None = None
    # shard the model over this many ranks (parallel/): this process is rank 0 and starts
    # the others; on CUDA one device each (cuda:0..N-1), decode steps run eagerly
    tensor_parallel_size: int = 1
    # Emulate a GPU (a planner device name, e.g. h200): the host side runs for real, each
    # step waits the time the cost model gives the emulated model on it (emulation/). The
    # model: a planner preset or a config.json; its quantization as the planner names them.
    # The served model's tokenizer and vocabulary stay; tensor_parallel_size is emulated.
    emulate_device: str | None = None
    emulate_model: str | None = None
    emulate_quantization: str | None = None
    model_config: ModelConfig = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.model = Path(self.model)
        self.model_config = ModelConfig.from_folder(self.model)
        mc = self.model_config
        if self.emulate_device is not None:
            self._check_emulation()
        elif self.device == "auto":
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        try:
            device = torch.device(self.device)
        except RuntimeError:
            raise ConfigError(
                f"device {self.device!r} is not a torch device (cpu, cuda, cuda:1, ...)"
            ) from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError("device 'cuda' was asked for but no CUDA device is available")
        if device.type not in ("cpu", "cuda"):
            raise ConfigError(f"device {self.device!r} is not supported; use cpu or cuda")
        if self.dtype == "auto":
            if str(self.device).startswith("cuda"):
                self.dtype = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
            else:
                self.dtype = "float32"
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype {self.dtype!r} is not one of {', '.join(DTYPES)} or 'auto'")
        limit = mc.max_position_embeddings
        if self.max_model_len is None:
            self.max_model_len = limit
        elif not 1 < self.max_model_len <= limit:
            raise ConfigError(
                f"max_model_len {self.max_model_len} must be in 2..{limit} for this model"
            )
        # an emulated GPU's engine steps as a GPU's would: its defaults are the GPU's
        defaults = torch.device("cuda") if self.emulate_device is not None else device
        self._check_batch_budget(defaults)
        self._check_background_budget(defaults)
        self._check_prefill_share(defaults)
        if self.max_num_seqs < 1 or self.block_size < 1:
            raise ConfigError("max_num_seqs and block_size must be positive")
        if self.kv_cache_bytes is not None and self.kv_cache_bytes < self.kv_block_bytes:
            raise ConfigError(
                f"kv_cache_bytes {self.kv_cache_bytes} holds no KV block; one block of "
                f"{self.block_size} tokens needs {self.kv_block_bytes} bytes"
            )
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError("gpu_memory_utilization must be in (0, 1]")
        self._check_lora()
        self._check_graphs()
        self._check_tensor_parallel(device)
        try:
            self.attention_backend = attention_backend(self.attention_backend, device)
        except ValueError as e:
            raise ConfigError(str(e)) from None

    def _check_batch_budget(self, device: torch.device) -> None:
        assert self.max_model_len is not None
        if self.max_num_batched_tokens is None:
            self.max_num_batched_tokens = default_batch_tokens(
                device.type, self.enable_chunked_prefill, self.max_model_len, self.max_num_seqs
            )
        budget = self.max_num_batched_tokens
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise ConfigError(f"max_num_batched_tokens must be a positive integer, got {budget!r}")
        if not self.enable_chunked_prefill and budget < self.max_model_len:
            raise ConfigError(
                f"max_num_batched_tokens {budget} must be at least max_model_len "
                f"{self.max_model_len} without chunked prefill, or a long prompt could never "
                f"be scheduled; raise it or enable chunked prefill"
            )
        if self.enable_chunked_prefill and budget < self.max_num_seqs:
            raise ConfigError(
                f"max_num_batched_tokens {budget} must be at least max_num_seqs "
                f"{self.max_num_seqs}, so every running sequence can decode in each step"
            )

    def _check_background_budget(self, device: torch.device) -> None:
        """A tenant's token waits for the whole step, and one arriving waits for the step
        under way, so a background chunk should cost about what a decode step does. On cpu
        (fp32) a step's cost per token levels off from about 32 tokens (about 70% of the
        throughput of 512-token steps; bench/background_priority.py). On cuda the
        projections stay memory-bound up to about 300 tokens (a Hopper's bf16 FLOP per byte
        of weights), so 256 tokens cost about one pass over the weights, as a decode does."""
        assert self.max_num_batched_tokens is not None
        value = self.background_tokens_per_step
        if value is None:
            value = 256 if device.type == "cuda" else 32
        elif isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(
                f"background_tokens_per_step must be a non-negative integer, got {value!r}"
            )
        self.background_tokens_per_step = min(value, self.max_num_batched_tokens)

    def _check_prefill_share(self, device: torch.device) -> None:
        """A prompt beside another tenant's shorter one is cut to about that one's need, so
        the short request's step costs about what it would alone; the floor keeps the long
        prompt advancing. The floors are the background budget's, for the same reason: what
        a step of that many tokens costs is about what a decode step costs."""
        value = self.long_prefill_token_threshold
        if value is None:
            self.long_prefill_token_threshold = 256 if device.type == "cuda" else 16
        elif isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(
                f"long_prefill_token_threshold must be a non-negative integer, got {value!r}"
            )
        value = self.max_num_partial_prefills
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"max_num_partial_prefills must be a positive integer, got {value!r}")
        value = self.prefill_cost_context
        if value is None:
            cpu = device.type != "cuda"
            self.prefill_cost_context = self.model_config.attention_cost_context if cpu else 0
        elif isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"prefill_cost_context must be a non-negative integer, got {value!r}")

    @property
    def prefill_cost(self) -> PrefillCost:
        """What a prefill chunk costs of a step's budget."""
        return PrefillCost(self.prefill_cost_context or None)

    def _check_lora(self) -> None:
        if not isinstance(self.deterministic_kernels, bool):
            raise ConfigError(
                f"deterministic_kernels must be true or false, got {self.deterministic_kernels!r}"
            )
        if not isinstance(self.reserve_lora_slots, bool):
            raise ConfigError(
                f"reserve_lora_slots must be true or false, got {self.reserve_lora_slots!r}"
            )
        if self.reserve_lora_slots and self.enable_lora and self.max_loras is None:
            raise ConfigError(
                "reserve_lora_slots needs max_loras: the split it keeps is max_loras slots "
                "(unset, the pool sizes the slots by demand instead)"
            )
        if self.max_cpu_loras is None:
            self.max_cpu_loras = default_max_cpu_loras(self.max_loras)
        if self.lora_extra_bytes is not None and (
            isinstance(self.lora_extra_bytes, bool)
            or not isinstance(self.lora_extra_bytes, int)
            or self.lora_extra_bytes < 0
        ):
            raise ConfigError(
                f"lora_extra_bytes must be a non-negative integer, got {self.lora_extra_bytes!r}"
            )
        for name in ("max_loras", "max_cpu_loras", "max_lora_rank", "max_saved_module_params"):
            value = getattr(self, name)
            if name == "max_loras" and value is None:
                continue  # the pool decides
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.max_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ConfigError(
                f"max_cpu_loras {self.max_cpu_loras} must be at least max_loras {self.max_loras}: "
                f"host memory caches at least the adapters the device slots can hold"
            )

    def _check_graphs(self) -> None:
        if not isinstance(self.enforce_eager, bool):
            raise ConfigError(f"enforce_eager must be true or false, got {self.enforce_eager!r}")
        size = self.max_cudagraph_capture_size
        if size is None:
            self.max_cudagraph_capture_size = min(self.max_num_seqs, 256)
        elif isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigError(
                f"max_cudagraph_capture_size must be a positive integer, got {size!r}"
            )
        else:  # no decode batch is larger than max_num_seqs: a bigger graph would never run
            self.max_cudagraph_capture_size = min(size, self.max_num_seqs)

    def _check_tensor_parallel(self, device: torch.device) -> None:
        size = self.tensor_parallel_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigError(f"tensor_parallel_size must be a positive integer, got {size!r}")
        if size == 1 or self.emulate_device is not None:  # the emulated model's shards
            return  # are the planner's to check (emulation/target.py)
        check_shardable(self.model_config, size)
        timeout_seconds()  # a bad LORAPLEX_TP_TIMEOUT_SECONDS is refused before any rank starts
        if device.type == "cuda":
            if device.index not in (None, 0):
                raise ConfigError(
                    f"a tensor-parallel engine runs rank i on cuda:i; device {self.device!r} "
                    f"must be 'cuda' (rank 0 on cuda:0)"
                )
            if torch.cuda.device_count() < size:
                raise ConfigError(
                    f"tensor_parallel_size {size} needs {size} CUDA devices, "
                    f"{torch.cuda.device_count()} are visible"
                )

    def _check_emulation(self) -> None:
        """An emulated device runs its host side on the CPU, for a model the planner knows."""
        if self.device not in ("auto", "cpu"):
            raise ConfigError(
                f"an emulated device runs on the cpu; device {self.device!r} was asked for"
            )
        self.device = "cpu"
        if not self.emulate_model:
            raise ConfigError(
                "emulate_device needs emulate_model: a planner preset or a config.json"
            )

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def kv_block_bytes(self) -> int:
        """Bytes of one KV block across all layers (keys and values)."""
        return kv_bytes_per_token(self.model_config, self.torch_dtype.itemsize) * self.block_size
