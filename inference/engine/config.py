"""Engine configuration and the model's shape as read from its config.json."""

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from inference.kernels.backend import attention_backend

from .errors import ConfigError, ModelLoadError
from .families import FAMILIES, FULL, SLIDING, family_traits
from .lora.peft_rules import DEFAULT_MAX_SAVED_MODULE_PARAMS

SUPPORTED_ARCHITECTURES = tuple(FAMILIES)
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "longrope")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

Rope = tuple[float, dict[str, Any] | None]  # (theta, scaling or None)


@dataclass(frozen=True)
class ModelConfig:
    """The numbers of a config.json the engine needs, and its family's switches
    (families.py)."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...]
    sliding_window: int | None
    family: str = "llama"
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # RMSNorm over each head of q and k, before rotary
    norm_offset: float = 0.0  # Gemma's norms scale by (1 + w)
    sandwich_norms: bool = False  # Gemma: norms after attention and around the MLP too
    hidden_act: str = "silu"
    embed_scale: float | None = None
    attn_softcap: float | None = None
    final_softcap: float | None = None
    query_pre_attn_scalar: float | None = None  # attention scale is its -1/2 power
    layer_windows: tuple[int | None, ...] = ()  # per layer: its sliding window, None = global
    local_rope: Rope | None = None  # sliding layers' rotary, where it differs (Gemma 3)
    rotary_dim: int = 0  # leading dims of each head that rotate (Phi's partial rotary)

    @property
    def attn_scale(self) -> float:
        scalar = float(self.query_pre_attn_scalar or self.head_dim)
        return 1.0 / math.sqrt(scalar)

    @property
    def uniform_window(self) -> int | None:
        """The sliding window, when every layer has one (then old blocks can be let go)."""
        windows = set(self.layer_windows)
        if len(windows) == 1 and None not in windows:
            return windows.pop()
        return None

    @property
    def longrope_original(self) -> int | None:
        """LongRoPE's original context, past which the long factors rotate."""
        if self.rope_scaling is None or self.rope_scaling["rope_type"] != "longrope":
            return None
        return int(self.rope_scaling["original_max_position_embeddings"])

    def layer_rope(self, layer: int) -> Rope:
        if self.local_rope is not None and self.layer_windows[layer] is not None:
            return self.local_rope
        return self.rope_theta, self.rope_scaling

    @classmethod
    def from_folder(cls, folder: str | Path) -> "ModelConfig":
        path = Path(folder) / "config.json"
        if not Path(folder).is_dir():
            raise ModelLoadError(f"model folder {folder} does not exist or is not a folder")
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise ModelLoadError(
                f"{path} is missing; point the engine at a Hugging Face model folder"
            ) from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ModelLoadError(f"{path} is not valid JSON ({e}); re-download the model") from None
        if not isinstance(raw, dict):
            raise ModelLoadError(f"{path} must hold a JSON object")
        return cls.from_dict(raw, source=str(path))

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config.json") -> "ModelConfig":
        archs = raw.get("architectures") or []
        if not isinstance(archs, list):
            raise ModelLoadError(f"{source}: architectures must be a list, got {archs!r:.80}")
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ModelLoadError(
                f"{source}: architecture {archs or 'unknown'} is not supported; "
                f"the engine serves {', '.join(SUPPORTED_ARCHITECTURES)}"
            )

        def need(key: str) -> int:
            value = raw.get(key)
            if value is None:
                raise ModelLoadError(f"{source}: required key {key!r} is missing")
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ModelLoadError(
                    f"{source}: {key} must be a positive integer, got {value!r:.80}"
                )
            return int(value)

        hidden, heads = need("hidden_size"), need("num_attention_heads")
        kv_heads = need("num_key_value_heads") if raw.get("num_key_value_heads") else heads
        if heads % kv_heads:
            raise ModelLoadError(
                f"{source}: {heads} attention heads is not a multiple of {kv_heads} KV heads"
            )
        num_layers = need("num_hidden_layers")
        head_dim = need("head_dim") if raw.get("head_dim") else hidden // heads
        (theta, scaling), local_rope, rotary_dim = _ropes(raw, head_dim, source)
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos if isinstance(eos, list) else [] if eos is None else [eos])
        return cls(
            architecture=arch,
            vocab_size=need("vocab_size"),
            hidden_size=hidden,
            intermediate_size=need("intermediate_size"),
            num_layers=num_layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            eos_token_ids=tuple(int(i) for i in eos_ids),
            sliding_window=raw.get("sliding_window"),
            local_rope=local_rope,
            rotary_dim=rotary_dim,
            **family_traits(raw, FAMILIES[arch], num_layers, source),
        )


def _ropes(raw: dict[str, Any], head_dim: int, source: str) -> tuple[Rope, Rope | None, int]:
    """(global rope, sliding layers' rope if different, rotary dims) from either layout:
    transformers 5 writes `rope_parameters` (per layer type for Gemma 3), older configs a
    top-level `rope_theta` plus `rope_scaling` (and Gemma 3's `rope_local_base_freq`)."""
    params = dict(raw.get("rope_parameters") or {})
    local: Rope | None = None
    if isinstance(params.get(FULL), dict):  # one set per layer type
        local_params = params.get(SLIDING) or {}
        params = dict(params[FULL])
        local = _rope(raw, {}, dict(local_params), source)
    elif raw.get("rope_local_base_freq") is not None:
        local = float(raw["rope_local_base_freq"]), None
    partial = float(params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0)))
    rotary_dim = int(head_dim * partial)
    if not 0 < rotary_dim <= head_dim or rotary_dim % 2:
        raise ModelLoadError(
            f"{source}: partial_rotary_factor {partial} leaves {rotary_dim} of {head_dim} "
            "head dims to rotate; it must be an even, positive number"
        )
    rope = _rope(raw, dict(raw.get("rope_scaling") or {}), params, source)
    if rope[1] is not None and rope[1]["rope_type"] == "longrope":
        _check_longrope(rope[1], rotary_dim, raw, source)
    return rope, local, rotary_dim


def _rope(
    raw: dict[str, Any], scaling: dict[str, Any], params: dict[str, Any], source: str
) -> Rope:
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    merged = {**scaling, **params}
    rope_type = merged.get("rope_type", merged.get("type", "default"))
    if rope_type == "su":  # early Phi-3 configs' name for LongRoPE
        rope_type = "longrope"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ModelLoadError(
            f"{source}: rope type {rope_type!r} is not supported "
            f"({', '.join(SUPPORTED_ROPE_TYPES)})"
        )
    if rope_type == "default":
        return float(theta), None
    merged["rope_type"] = rope_type
    merged.pop("type", None)
    merged.pop("rope_theta", None)
    merged.pop("partial_rotary_factor", None)
    if rope_type == "longrope":
        return float(theta), merged
    if "factor" not in merged:
        raise ModelLoadError(f"{source}: rope scaling {rope_type!r} needs a 'factor'")
    if rope_type == "llama3":
        merged.setdefault("original_max_position_embeddings", raw.get("max_position_embeddings"))
        for key in ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
            if merged.get(key) is None:
                raise ModelLoadError(f"{source}: llama3 rope scaling needs {key!r}")
    return float(theta), merged


def _check_longrope(
    scaling: dict[str, Any], rotary_dim: int, raw: dict[str, Any], source: str
) -> None:
    """Fill in LongRoPE's derived numbers the way transformers does, after checking it."""
    original = scaling.get("original_max_position_embeddings") or raw.get(
        "original_max_position_embeddings"
    )
    if isinstance(original, bool) or not isinstance(original, int) or original < 1:
        raise ModelLoadError(f"{source}: longrope needs original_max_position_embeddings")
    for key in ("short_factor", "long_factor"):
        factors = scaling.get(key)
        if (
            not isinstance(factors, list)
            or len(factors) != rotary_dim // 2
            or not all(isinstance(f, int | float) and f > 0 for f in factors)
        ):
            raise ModelLoadError(
                f"{source}: longrope {key} must list {rotary_dim // 2} positive numbers"
            )
    factor = scaling.get("factor") or raw.get("max_position_embeddings", original) / original
    if scaling.get("attention_factor") is None:
        scaling["attention_factor"] = (
            1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
        )
    scaling["original_max_position_embeddings"] = original


@dataclass
class EngineConfig:
    """Everything fixed at start-up. Reads the model's config.json on creation, so a bad
    folder or a value that cannot work fails here, before any weight is loaded."""

    model: str | Path
    device: str = "auto"  # "auto": cuda when available, else cpu
    dtype: str = "auto"  # "auto": float32 on cpu, bfloat16 (or float16) on cuda
    max_model_len: int | None = None  # prompt + completion tokens; default: the model's
    max_num_seqs: int = 128
    # tokens per step, decodes and prefill chunks together. Default: with chunked prefill
    # 512 on cpu (a step stays short) and 8192 on cuda; without, max(max_model_len, 2048)
    max_num_batched_tokens: int | None = None
    block_size: int = 16
    # reuse the KV blocks of prompt prefixes already computed (per adapter)
    enable_prefix_caching: bool = True
    # prefill a long prompt over several steps, alongside the running decodes
    enable_chunked_prefill: bool = True
    # KV cache + LoRA slots. Unset: on cpu the slots plus 512 MiB of cache (at least one
    # max_model_len sequence), on cuda a share of device memory (kv_cache.py)
    kv_cache_bytes: int | None = None
    gpu_memory_utilization: float = 0.9  # on cuda without kv_cache_bytes: share of device memory
    seed: int = 0  # seeds requests that give no seed of their own
    # "auto": Triton paged attention on CUDA, the torch reference on CPU; "torch", "triton"
    attention_backend: str = "auto"
    # LoRA: device slots (adapters in one batch), host cache entries, largest rank served
    enable_lora: bool = False
    max_loras: int = 4
    max_cpu_loras: int | None = None  # default: max(4 * max_loras, 16)
    max_lora_rank: int = 16
    # an adapter's whole embed_tokens / lm_head copy (modules_to_save) is served up to this
    max_saved_module_params: int = DEFAULT_MAX_SAVED_MODULE_PARAMS
    # device bytes for DoRA scales, LoRA on the heads and saved heads, shared by the slots'
    # adapters that have them; default: room for every slot (lora/slots.py)
    lora_extra_bytes: int | None = None
    # decode steps replay CUDA graphs (cuda_graphs.py) on CUDA with the Triton attention
    # backend; True runs every step eagerly (vLLM's name), for debugging
    enforce_eager: bool = False
    # the largest decode batch a graph is captured for; larger batches run eagerly.
    # Default: min(max_num_seqs, 256)
    max_cudagraph_capture_size: int | None = None
    # shard the model over this many ranks (parallel/): this process is rank 0 and starts
    # the others; on CUDA one device each (cuda:0..N-1), decode steps run eagerly
    tensor_parallel_size: int = 1
    model_config: ModelConfig = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.model = Path(self.model)
        self.model_config = ModelConfig.from_folder(self.model)
        mc = self.model_config
        if self.device == "auto":
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
        self._check_batch_budget(device)
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
            if not self.enable_chunked_prefill:
                self.max_num_batched_tokens = max(self.max_model_len, 2048)
            else:
                self.max_num_batched_tokens = 8192 if device.type == "cuda" else 512
                self.max_num_batched_tokens = max(self.max_num_batched_tokens, self.max_num_seqs)
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

    def _check_lora(self) -> None:
        if self.max_cpu_loras is None:
            self.max_cpu_loras = max(4 * self.max_loras, 16)
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
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.max_cpu_loras < self.max_loras:
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
        if size == 1:
            return
        from .parallel.group import timeout_seconds
        from .parallel.plan import check_shardable

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

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def kv_block_bytes(self) -> int:
        """Bytes of one KV block across all layers (keys and values)."""
        mc = self.model_config
        per_token = 2 * mc.num_layers * mc.num_kv_heads * mc.head_dim * self.torch_dtype.itemsize
        return per_token * self.block_size
