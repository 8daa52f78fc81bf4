"""A capacity plan for an engine the Engines page shows: the planner (the engine's own
arithmetic) run for the engine's base model, device and settings, beside what the engine
reports it allocated. A difference means memory the plan did not foresee (or settings
changed since the engine started)."""

import json
from dataclasses import dataclass, field
from pathlib import Path

from inference.engine.planning import Plan, PlanError, PlanRequest, device_for, plan

from .engines import EngineState
from .models import Adapter, BaseModel

# what the engine reports (its /metrics), beside the planned figures
WEIGHTS, KV_BLOCKS, SLOTS = (
    "loraplex_weights_bytes",
    "loraplex_kv_cache_blocks_total",
    "loraplex_lora_slots_total",
)


@dataclass
class EnginePlan:
    plan: Plan | None = None
    rows: list[tuple[str, float | None, float | None]] = field(default_factory=list)
    error: str = ""


def engine_plan(state: EngineState) -> EnginePlan:
    """The plan for this engine, or why there is none (an engine too old to report its
    settings, a base model the registry does not know or whose config.json is not here)."""
    info = state.info
    if not info:
        return EnginePlan(error="the engine does not report its device and settings")
    base = BaseModel.objects.filter(name=info.get("base_model", "")).first()
    if base is None:
        return EnginePlan(error=f"base model {info.get('base_model')!r} is not in the registry")
    try:
        config = json.loads((Path(base.local_path) / "config.json").read_text())
        result = plan(_request(info, config, base))
    except (OSError, ValueError) as e:  # json and PlanError are ValueErrors
        return EnginePlan(error=f"no plan for {base.name}: {e}")
    reported = state.metrics
    slots = reported.get(SLOTS)
    rows: list[tuple[str, float | None, float | None]] = [
        ("weights bytes per GPU", result.weights_bytes_per_gpu, reported.get(WEIGHTS)),
        ("KV cache blocks", result.kv_blocks, reported.get(KV_BLOCKS)),
        ("device adapter slots", result.device_slots, slots),
        ("host adapter copies", result.host_slots, None),
    ]
    return EnginePlan(plan=result, rows=rows)


def _request(info: dict[str, str], config: dict, base: BaseModel) -> PlanRequest:
    """The engine's own settings, fixed, so the plan reproduces its allocation."""
    max_model_len = int(info["max_model_len"])
    kv_cache_bytes = int(info["kv_cache_bytes"]) or None
    try:
        return PlanRequest(
            config=config,
            name=base.name,
            device=device_for(
                info["device_type"], info["device_name"], int(info["device_memory_bytes"])
            ),
            tp=int(info["tensor_parallel_size"]),
            rank=int(info["max_lora_rank"]),
            tenants=max(Adapter.objects.filter(base_model=base).count(), 1),
            prompt_tokens=max_model_len - 1,
            output_tokens=1,
            concurrency=int(info["max_num_seqs"]),
            gpu_memory_utilization=float(info["gpu_memory_utilization"]),
            block_size=int(info["block_size"]),
            dtype=info["dtype"],
            max_loras=int(info["max_loras"]) if info["max_loras"] != "" else None,
            max_cpu_loras=int(info["max_cpu_loras"]),
            max_model_len=max_model_len,
            max_num_batched_tokens=int(info["max_num_batched_tokens"]),
            kv_cache_bytes=kv_cache_bytes,
            engine_pool=True,
            enforce_eager=info["enforce_eager"] == "True",
            suggest=False,
        )
    except (KeyError, ValueError) as e:
        raise PlanError(f"the engine's settings are incomplete ({e})") from None
