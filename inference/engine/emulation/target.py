"""What the emulated device stands for: a GPU the planner knows, a model (a planner preset or
a config.json), its quantization and the tensor-parallel size, and the plan that sizes the
engine's pool as that deployment's would be."""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..model_config import ModelConfig
from ..planning import DEVICES, PRESETS, Plan, PlanError, PlanRequest, device_named, plan
from ..planning.devices import Device
from ..planning.planner import model_config
from ..planning.quantizations import with_quantization


@dataclass(frozen=True)
class EmulationTarget:
    device: Device
    model_name: str
    model: ModelConfig  # quantized as asked
    quantization: str | None
    tensor_parallel_size: int
    plan: Plan

    @classmethod
    def resolve(
        cls,
        device: str,
        model: str,
        quantization: str | None,
        tensor_parallel_size: int,
        *,
        max_model_len: int,
        max_num_batched_tokens: int,
        block_size: int,
        kv_cache_bytes: int | None = None,
        gpu_memory_utilization: float = 0.9,
    ) -> "EmulationTarget":
        """The target named by the engine's emulation settings; ConfigError says what is
        wrong with them."""
        if device not in DEVICES:
            raise ConfigError(
                f"emulate_device must name a GPU the planner knows ({', '.join(DEVICES)}), "
                f"got {device!r}"
            )
        gpu = device_named(device)
        raw, name = _model_config(model)
        request = PlanRequest(
            config=raw,
            device=gpu,
            name=name,
            quantization=quantization,
            tp=tensor_parallel_size,
            max_model_len=max_model_len,
            max_num_batched_tokens=max_num_batched_tokens,
            block_size=block_size,
            kv_cache_bytes=kv_cache_bytes,
            gpu_memory_utilization=gpu_memory_utilization,
            engine_pool=True,
            suggest=False,
        )
        try:
            planned = plan(request)
            mc = with_quantization(model_config(raw, source=name), quantization)
        except (PlanError, ValueError) as e:
            raise ConfigError(f"emulated {name} on {device}: {e}") from None
        if planned.kv_blocks < 1:  # the traffic the plan assumes is the benchmark's to pick
            raise ConfigError(f"emulated {name} on {device}: {planned.reason}")
        return cls(gpu, name, mc, quantization, tensor_parallel_size, planned)


def _model_config(model: str) -> tuple[dict[str, Any], str]:
    """A preset's config.json, or the one at `model` (a file or its folder)."""
    if model in PRESETS:
        return PRESETS[model], model
    file = Path(model)
    if file.is_dir():
        file = file / "config.json"
    if not file.is_file():
        raise ConfigError(
            f"emulate_model {model!r} is neither a preset ({', '.join(PRESETS)}) "
            "nor a config.json"
        )
    try:
        raw = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"emulate_model {model}: cannot read it as JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"emulate_model {model}: must hold a JSON object")
    return raw, str(model)
