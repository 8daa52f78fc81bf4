"""What fits on a device before anyone buys one: weights, KV cache, adapter slots and the
engine settings that get them, from a model's config.json and a few traffic figures.

Every figure is one GPU's (rank 0's: all ranks hold the same shapes) and comes from the
engine's own arithmetic: the model built on the meta device (weights, slot layout), the KV
bytes per token, the slots' bytes, the memory pool formula. The pool (the share
`gpu_memory_utilization` of memory, less weights, activations, graphs and the runtime) is
cut first into KV for `concurrency` sequences of prompt + output tokens, then into device
slots (one per adapter up to the concurrency: a batch never uses more), and what is left
is more KV cache.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..config import (
    DTYPES,
    default_batch_tokens,
    default_max_cpu_loras,
    kv_bytes_per_token,
)
from ..errors import ConfigError, ModelLoadError
from ..fingerprint import TARGET_MODULES
from ..kv_cache import cpu_default_kv_bytes, memory_pool_bytes
from ..lora.peft_rules import DEFAULT_MAX_SAVED_MODULE_PARAMS
from ..lora.slots import reserved_nbytes, slot_layout
from ..memory_pool import CPU_DEFAULT_SLOTS, pages_per_slot
from ..model_config import ModelConfig
from ..parallel.plan import ShardPlan, check_shardable
from .devices import Device
from .memory import (
    RUNTIME_RESERVE_BYTES,
    graph_reserve_bytes,
    meta_model,
    resident_weight_bytes,
    step_activation_bytes,
)
from .quantizations import ORDER, quantization_name, with_quantization
from .step_time import RATES, StepTimeModel
from .traffic import HitRates, expected_distinct, simulate, zipf_weights

DEFAULT_CONCURRENCY = 64  # LORAPLEX_MAX_NUM_SEQS's default
TP_SIZES = (1, 2, 4, 8)
PREFILL_REFERENCE_TOKENS = 1024  # the prompt prefill_ms_per_1k_tokens times


class PlanError(ValueError):
    """A request the planner cannot plan for (bad shapes, unknown target); says why."""


@dataclass(frozen=True)
class PlanRequest:
    config: dict[str, Any]  # the model's config.json
    device: Device
    name: str = ""  # the model's, as the plan shows it (default: its architecture)
    quantization: str | None = None  # None: as config.json says (bf16 when unquantized)
    tp: int = 1
    rank: int = 16
    targets: tuple[str, ...] = TARGET_MODULES  # the adapters' target modules
    tenants: int = 100  # adapters, one per tenant
    zipf: float = 1.1
    usage_counts: tuple[int, ...] | None = None  # requests per adapter, instead of Zipf
    prompt_tokens: int = 1024
    output_tokens: int = 256
    concurrency: int = DEFAULT_CONCURRENCY
    gpu_memory_utilization: float = 0.9
    block_size: int = 16
    dtype: str = "auto"  # the engine's: bfloat16 on cuda, float32 on cpu
    # An engine's own settings, where they are fixed (the admin's Engines page) rather than
    # chosen; `engine_pool`: size the pool as an engine without LORAPLEX_KV_CACHE_BYTES does
    max_loras: int | None = None
    max_cpu_loras: int | None = None
    max_model_len: int | None = None
    max_num_batched_tokens: int | None = None
    kv_cache_bytes: int | None = None
    engine_pool: bool = False
    enforce_eager: bool = False
    suggest: bool = True  # when nothing fits, plan the alternatives that would


@dataclass
class Plan:
    """One GPU's figures (`tp` GPUs hold the same), and what they come from."""

    model: str
    device: str
    quantization: str
    tp: int
    dtype: str
    fits: bool
    reason: str
    memory_bytes_per_gpu: int
    usable_bytes_per_gpu: int  # memory * gpu_memory_utilization
    weights_bytes_per_gpu: int
    activation_bytes_per_gpu: int
    graph_bytes_per_gpu: int
    runtime_bytes_per_gpu: int
    pool_bytes_per_gpu: int  # KV cache + adapter slots
    kv_bytes_per_token_per_gpu: int
    adapter_bytes_per_gpu: int  # one slot row: every target linear at the rank
    adapter_weights_bytes_per_gpu: int  # the adapter's own factors, on its targets
    slots_bytes_per_gpu: int  # all device slots with their scales, buffer and extras
    device_slots: int  # the upper bound on adapters in device memory (LORAPLEX_MAX_LORAS)
    host_slots: int
    kv_blocks: int  # the pool's pages: all KV cache while no adapter sits in a slot
    pages_per_slot: int  # the pages an adapter in a device slot takes from the KV cache
    adapters_active: int  # distinct adapters expected among `concurrency` requests
    kv_blocks_busy: int  # the KV pages left beside that many adapters
    block_size: int
    max_model_len: int
    max_batch: int  # sequences of prompt + output tokens the KV cache holds at once
    concurrency: int
    hit_rates: HitRates
    swap_in_seconds: float
    # the step-time model's (step_time.py), on a GPU it has rates for; None elsewhere
    decode_step_ms: float | None = None  # `concurrency` sequences at max_model_len
    decode_step_ms_batch1: float | None = None  # one sequence at max_model_len
    prefill_ms_per_1k_tokens: float | None = None  # one 1,024-token prompt
    settings: dict[str, int | float | str] = field(default_factory=dict)
    suggestions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def kv_tokens(self) -> int:
        return self.kv_blocks * self.block_size

    @property
    def kv_tokens_slots_full(self) -> int:
        """The KV cache left while every device slot holds an adapter."""
        return max(self.kv_blocks - self.device_slots * self.pages_per_slot, 0) * self.block_size

    def to_dict(self) -> dict[str, Any]:
        """Byte figures for the whole deployment (all `tp` GPUs together) with the one
        GPU's beside them as `<name>_per_gpu`."""
        whole = {}
        for name in (
            "memory_bytes",
            "usable_bytes",
            "weights_bytes",
            "activation_bytes",
            "graph_bytes",
            "runtime_bytes",
            "pool_bytes",
            "kv_bytes_per_token",
            "adapter_bytes",
            "adapter_weights_bytes",
            "slots_bytes",
        ):
            per_gpu = getattr(self, f"{name}_per_gpu")
            whole[name] = per_gpu * self.tp
            whole[f"{name}_per_gpu"] = per_gpu
        return {
            "model": self.model,
            "device": self.device,
            "quantization": self.quantization,
            "tp": self.tp,
            "dtype": self.dtype,
            "fits": self.fits,
            "reason": self.reason,
            **whole,
            "host_bytes": self.host_slots * self.adapter_bytes_per_gpu * self.tp,
            "device_slots": self.device_slots,
            "host_slots": self.host_slots,
            "kv_blocks": self.kv_blocks,
            "pages_per_slot": self.pages_per_slot,
            "adapters_active": self.adapters_active,
            "kv_tokens_busy": self.kv_blocks_busy * self.block_size,
            "kv_tokens_slots_full": self.kv_tokens_slots_full,
            "block_size": self.block_size,
            "kv_tokens": self.kv_tokens,
            "max_model_len": self.max_model_len,
            "max_batch": self.max_batch,
            "concurrency": self.concurrency,
            "hit_rates": {
                "device": self.hit_rates.device,
                "host": self.hit_rates.host,
                "disk": self.hit_rates.disk,
            },
            "swap_in_seconds": self.swap_in_seconds,
            "decode_step_ms": self.decode_step_ms,
            "decode_step_ms_batch1": self.decode_step_ms_batch1,
            "prefill_ms_per_1k_tokens": self.prefill_ms_per_1k_tokens,
            "settings": self.settings,
            "suggestions": self.suggestions,
        }


def model_config(raw: dict[str, Any], source: str = "config.json") -> ModelConfig:
    try:
        return ModelConfig.from_dict(raw, source=source)
    except ModelLoadError as e:
        raise PlanError(str(e)) from None


def plan(request: PlanRequest) -> Plan:
    """The plan for `request`; PlanError when it cannot be planned at all."""
    _check_request(request)
    base = model_config(request.config)
    try:
        mc = with_quantization(base, request.quantization)
    except ValueError as e:
        raise PlanError(str(e)) from None
    if request.tp > 1:
        try:
            check_shardable(mc, request.tp)
        except ConfigError as e:
            raise PlanError(str(e)) from None
    max_model_len = request.max_model_len or request.prompt_tokens + request.output_tokens
    if max_model_len > mc.max_position_embeddings:
        raise PlanError(
            f"prompt + output tokens ({max_model_len}) exceed the model's context of "
            f"{mc.max_position_embeddings} tokens"
        )
    result = _plan(request, mc, max_model_len)
    if not result.fits and request.suggest:
        result.suggestions = _alternatives(request, result)
        if result.suggestions:
            result.reason += "; it fits with " + " or with ".join(
                _flags(request, s) for s in result.suggestions
            )
    return result


def _check_request(r: PlanRequest) -> None:
    positive = {
        "tp": r.tp,
        "rank": r.rank,
        "tenants": r.tenants,
        "prompt_tokens": r.prompt_tokens,
        "output_tokens": r.output_tokens,
        "concurrency": r.concurrency,
        "block_size": r.block_size,
    }
    for name, value in positive.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PlanError(f"{name} must be a positive integer, got {value!r}")
    if not 0 < r.gpu_memory_utilization <= 1:
        raise PlanError("gpu_memory_utilization must be in (0, 1]")
    if r.zipf < 0:
        raise PlanError(f"zipf must be non-negative, got {r.zipf}")
    if r.dtype != "auto" and r.dtype not in DTYPES:
        raise PlanError(f"dtype {r.dtype!r} is not one of {', '.join(DTYPES)} or 'auto'")
    unknown = [t for t in r.targets if t not in TARGET_MODULES]
    if unknown or not r.targets:
        raise PlanError(
            f"unknown target module {', '.join(unknown) or '(none)'}; targets are all-linear "
            f"or a list of {', '.join(TARGET_MODULES)}"
        )
    if r.usage_counts is not None and (not r.usage_counts or min(r.usage_counts) < 0):
        raise PlanError("usage counts must list one non-negative count per adapter")


def _plan(r: PlanRequest, mc: ModelConfig, max_model_len: int) -> Plan:
    device = r.device
    dtype_name = (
        r.dtype if r.dtype != "auto" else "bfloat16" if device.kind == "cuda" else "float32"
    )
    dtype = DTYPES[dtype_name]
    item = dtype.itemsize
    local = ShardPlan(0, r.tp, mc).local_config() if r.tp > 1 else mc
    model = meta_model(mc, dtype, r.tp, max_model_len)
    weights = resident_weight_bytes(model)
    block_bytes = kv_bytes_per_token(local, item) * r.block_size
    layout = slot_layout(model, r.rank)
    adapter_weights = sum(
        (r.rank * fan_in + fan_out * r.rank) * item
        for (_, module), (_, _, fan_in, fan_out) in layout.offsets.items()
        if module in r.targets
    )
    batch_tokens = r.max_num_batched_tokens or default_batch_tokens(
        device.kind, True, max_model_len, r.concurrency
    )
    graphs = device.kind == "cuda" and r.tp == 1 and not r.enforce_eager
    graph_bytes = (
        graph_reserve_bytes(mc, dtype, r.concurrency, max_model_len, r.block_size) if graphs else 0
    )
    activations = step_activation_bytes(local, item, batch_tokens, max_model_len)
    runtime = RUNTIME_RESERVE_BYTES if device.kind == "cuda" else 0
    usable = int(device.memory_bytes * r.gpu_memory_utilization)
    room = memory_pool_bytes(
        device.memory_bytes, r.gpu_memory_utilization, weights + runtime, activations, graph_bytes
    )
    slot_tokens = max(batch_tokens, r.concurrency)
    seq_blocks = -(-max_model_len // r.block_size)
    pad = 1 if graphs else 0  # the decode graphs' padding page, never handed out
    k = pages_per_slot(layout.numel * item, block_bytes)
    adapters = len(r.usage_counts) if r.usage_counts is not None else r.tenants
    weights_by_adapter = (
        list(r.usage_counts) if r.usage_counts is not None else zipf_weights(adapters, r.zipf)
    )
    if sum(weights_by_adapter) == 0:
        weights_by_adapter = [1.0] * adapters

    def reserved(slots: int | None) -> int:  # LoRA's bytes outside the pool
        return reserved_nbytes(
            model,
            slots,
            r.rank,
            slot_tokens,
            extra_bytes=None,
            max_saved_params=DEFAULT_MAX_SAVED_MODULE_PARAMS,
        )

    def pool_pages(reserved_bytes: int) -> tuple[int, int]:
        if r.kv_cache_bytes is not None:
            pool = r.kv_cache_bytes
        elif r.engine_pool and device.kind == "cpu":  # the CPU default cache, the slots' pages
            slot_pages = (r.max_loras or CPU_DEFAULT_SLOTS) * k * block_bytes
            default = cpu_default_kv_bytes(max_model_len, r.block_size, block_bytes)
            pool = reserved_bytes + default + slot_pages
        else:
            pool = room
        return pool, max(max(pool - reserved_bytes, 0) // block_bytes - pad, 0)

    if r.max_loras is not None or r.engine_pool:  # an engine's own: as it sizes them
        pool, pages = pool_pages(reserved(r.max_loras))
        slots = r.max_loras
        if slots is None:
            slots = max(0, min((pages - 1) // k, r.max_cpu_loras or 0))
    else:  # one slot per adapter up to the concurrency (a batch never holds more), as many
        # as leave KV for the concurrency's sequences beside them
        wanted = min(adapters, r.concurrency)
        pool, pages = pool_pages(reserved(wanted))
        need = r.concurrency * seq_blocks
        slots = max(0, min(wanted, (pages - need) // k, (pages - 1) // k))
        pool, pages = pool_pages(reserved(slots))  # the arena is sized for the slots set
    lora_reserved = reserved(slots if not r.engine_pool else r.max_loras)
    host = r.max_cpu_loras or max(min(adapters, default_max_cpu_loras(slots)), slots)
    active = min(slots, expected_distinct(weights_by_adapter, r.concurrency))
    kv_blocks_busy = max(pages - active * k, 0)  # the KV left beside the adapters in use
    max_batch = kv_blocks_busy // seq_blocks
    lora_bytes = lora_reserved + slots * k * block_bytes
    reason = _verdict(r, weights, usable, room, pool, lora_bytes, slots, max_batch, block_bytes)
    fits = not reason
    hit_rates = simulate(weights_by_adapter, min(slots, adapters), max(min(host, adapters), slots))
    result = Plan(
        model=r.name or mc.architecture,
        device=device.name,
        quantization=quantization_name(mc) if mc.quantization is not None else "bf16",
        tp=r.tp,
        dtype=dtype_name,
        fits=fits,
        reason=reason or "fits",
        memory_bytes_per_gpu=device.memory_bytes,
        usable_bytes_per_gpu=usable,
        weights_bytes_per_gpu=weights,
        activation_bytes_per_gpu=activations,
        graph_bytes_per_gpu=graph_bytes,
        runtime_bytes_per_gpu=runtime,
        pool_bytes_per_gpu=pool,
        kv_bytes_per_token_per_gpu=block_bytes // r.block_size,
        adapter_bytes_per_gpu=layout.numel * item,
        adapter_weights_bytes_per_gpu=adapter_weights,
        slots_bytes_per_gpu=lora_bytes,
        device_slots=slots,
        host_slots=host,
        kv_blocks=pages,
        pages_per_slot=k,
        adapters_active=active,
        kv_blocks_busy=kv_blocks_busy,
        block_size=r.block_size,
        max_model_len=max_model_len,
        max_batch=max_batch,
        concurrency=r.concurrency,
        hit_rates=hit_rates,
        swap_in_seconds=layout.numel * item / device.host_link_bandwidth,
    )
    if device.kind == "cuda" and device.name in RATES:
        steps = StepTimeModel(mc, device, tensor_parallel_size=r.tp, lora_targets=r.targets)
        result.decode_step_ms = steps.decode_step_ms(r.concurrency, max_model_len)
        result.decode_step_ms_batch1 = steps.decode_step_ms(1, max_model_len)
        result.prefill_ms_per_1k_tokens = steps.prefill_ms(PREFILL_REFERENCE_TOKENS)
    if fits:
        result.settings = _settings(r, result, batch_tokens)
    return result


def _verdict(
    r: PlanRequest,
    weights: int,
    usable: int,
    room: int,
    pool: int,
    lora_bytes: int,
    slots: int,
    max_batch: int,
    block_bytes: int,
) -> str:
    """Why it does not fit ('' when it does)."""
    gb = 1e9
    if room < block_bytes:
        return (
            f"the weights take {weights / gb:.1f} GB per GPU: with activations, graphs and "
            f"the runtime they leave no room for the KV cache in the {usable / gb:.1f} GB "
            f"usable ({r.gpu_memory_utilization:.0%} of {r.device.memory_bytes / gb:.1f} GB), "
            f"{max(-room, 0) / gb:.1f} GB short"
        )
    if pool > room and r.kv_cache_bytes is not None:
        return (
            f"kv_cache_bytes {pool / gb:.1f} GB is more than the {room / gb:.1f} GB the "
            f"GPU has left beside the weights"
        )
    if slots < 1:
        return (
            f"KV cache for {r.concurrency} sequences of {r.prompt_tokens + r.output_tokens} "
            f"tokens leaves no room for one adapter slot at rank {r.rank}"
        )
    if pool - lora_bytes < block_bytes:
        return f"the {slots} adapter slots ({lora_bytes / gb:.1f} GB) leave no KV block"
    if max_batch < r.concurrency:
        return (
            f"the KV cache holds {max_batch} sequences of {r.prompt_tokens + r.output_tokens} "
            f"tokens, fewer than the concurrency {r.concurrency}"
        )
    return ""


def _alternatives(r: PlanRequest, failed: Plan) -> list[dict[str, Any]]:
    """The nearest changes that fit: the smallest larger tensor-parallel size at this
    quantization, and the weakest stronger quantization at this size."""
    found = []
    for tp in (t for t in TP_SIZES if t > r.tp):
        alt = _try(replace(r, tp=tp, suggest=False))
        if alt is not None:
            found.append({"tp": tp, "quantization": failed.quantization, **_brief(alt)})
            break
    current = ORDER.index(failed.quantization) if failed.quantization in ORDER else None
    if current is not None:
        for name in ORDER[current + 1 :]:
            alt = _try(replace(r, quantization=name, suggest=False))
            if alt is not None:
                found.append({"tp": r.tp, "quantization": name, **_brief(alt)})
                break
    return found


def _try(r: PlanRequest) -> Plan | None:
    try:
        alt = plan(r)
    except PlanError:  # a size the heads do not split by
        return None
    return alt if alt.fits else None


def _brief(p: Plan) -> dict[str, Any]:
    return {"device_slots": p.device_slots, "kv_tokens": p.kv_tokens, "max_batch": p.max_batch}


def _flags(r: PlanRequest, s: dict[str, Any]) -> str:
    """The command-line change a suggestion makes: a larger --tp or another quantization."""
    return f"--tp {s['tp']}" if s["tp"] != r.tp else f"--quantization {s['quantization']}"


def _settings(r: PlanRequest, p: Plan, batch_tokens: int) -> dict[str, int | float | str]:
    """The environment `manage.py serve` reads (platform_site/settings.py) for this plan."""
    return {
        "LORAPLEX_TENSOR_PARALLEL_SIZE": r.tp,
        "LORAPLEX_DTYPE": p.dtype,
        "LORAPLEX_KV_CACHE_BYTES": p.pool_bytes_per_gpu,
        "LORAPLEX_GPU_MEMORY_UTILIZATION": r.gpu_memory_utilization,
        "LORAPLEX_MAX_LORAS": p.device_slots,
        "LORAPLEX_MAX_CPU_LORAS": p.host_slots,
        "LORAPLEX_MAX_LORA_RANK": r.rank,
        "LORAPLEX_MAX_MODEL_LEN": p.max_model_len,
        "LORAPLEX_MAX_NUM_SEQS": r.concurrency,
        "LORAPLEX_MAX_NUM_BATCHED_TOKENS": batch_tokens,
    }


# The EngineConfig field each setting sets (as platform_site/settings.py maps them).
SETTING_FIELDS = {
    "LORAPLEX_TENSOR_PARALLEL_SIZE": "tensor_parallel_size",
    "LORAPLEX_DTYPE": "dtype",
    "LORAPLEX_KV_CACHE_BYTES": "kv_cache_bytes",
    "LORAPLEX_GPU_MEMORY_UTILIZATION": "gpu_memory_utilization",
    "LORAPLEX_MAX_LORAS": "max_loras",
    "LORAPLEX_MAX_CPU_LORAS": "max_cpu_loras",
    "LORAPLEX_MAX_LORA_RANK": "max_lora_rank",
    "LORAPLEX_MAX_MODEL_LEN": "max_model_len",
    "LORAPLEX_MAX_NUM_SEQS": "max_num_seqs",
    "LORAPLEX_MAX_NUM_BATCHED_TOKENS": "max_num_batched_tokens",
}


def engine_options(settings: dict[str, int | float | str]) -> dict[str, Any]:
    """A plan's settings as EngineConfig keyword arguments."""
    return {SETTING_FIELDS[name]: value for name, value in settings.items()}


def parse_targets(text: str) -> tuple[str, ...]:
    """all-linear, or a comma-separated list of module names."""
    if text.strip() == "all-linear":
        return TARGET_MODULES
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    return _targets(names)


def _targets(names: Sequence[str]) -> tuple[str, ...]:
    unknown = [n for n in names if n not in TARGET_MODULES]
    if unknown or not names:
        raise PlanError(
            f"unknown target module {', '.join(unknown) or '(none)'}; use all-linear or a "
            f"comma-separated list of {', '.join(TARGET_MODULES)}"
        )
    return tuple(names)
