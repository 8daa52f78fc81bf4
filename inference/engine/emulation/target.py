"""What the emulated device stands for: a GPU the planner knows, a model (a planner preset or
a config.json), its quantization and the tensor-parallel size, and the plan that sizes the
engine's pool as that deployment's would be."""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import EngineConfig
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
    def resolve(cls, config: EngineConfig) -> "EmulationTarget":
        """The target the engine's emulation settings name, sized with its own settings;
        ConfigError says what is wrong with them."""
        device, model = config.emulate_device, config.emulate_model
        assert device is not None and model is not None  # checked by EngineConfig
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
            quantization=config.emulate_quantization,
            tp=config.tensor_parallel_size,
            rank=config.max_lora_rank,
            max_loras=config.max_loras if config.enable_lora else None,
            max_cpu_loras=config.max_cpu_loras,
            max_model_len=config.max_model_len,
            max_num_batched_tokens=config.max_num_batched_tokens,
            block_size=config.block_size,
            kv_cache_bytes=config.kv_cache_bytes,
            gpu_memory_utilization=config.gpu_memory_utilization,
            engine_pool=True,
            suggest=False,
        )
        try:
            planned = plan(request)
            mc = with_quantization(model_config(raw, source=name), config.emulate_quantization)
        except (PlanError, ValueError) as e:
            raise ConfigError(f"emulated {name} on {device}: {e}") from None
        if planned.kv_blocks < 1:  # the traffic the plan assumes is the benchmark's to pick
            raise ConfigError(f"emulated {name} on {device}: {planned.reason}")
        return cls(gpu, name, mc, config.emulate_quantization, config.tensor_parallel_size, planned)


def _model_config(model: str) -> tuple[dict[str, Any], str]:
    """A preset's config.json, or the one at `model` (a file or its folder)."""
    if model in PRESETS:
        return PRESETS[model], model
    file = Path(model)
    if file.is_dir():
        file = file / "config.json"
    if not file.is_file():
        raise ConfigError(
            f"emulate_model {model!r} is neither a preset ({', '.join(PRESETS)}) nor a config.json"
        )
    try:
        raw = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"emulate_model {model}: cannot read it as JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"emulate_model {model}: must hold a JSON object")
    return raw, str(model)
