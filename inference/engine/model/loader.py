"""Fill the model's parameters from the checkpoint's *.safetensors files.

Strict on purpose: a tensor the model lacks, a shape that differs from config.json, or a
parameter no file provides means the folder and its config disagree, and serving it would
produce garbage rather than an error.

A quantized base's projections (QuantizedLinear) take their tensors as stored and convert
them after the file that completes a layer, so a sharded checkpoint is never held whole on
the host.
"""

from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from ..errors import ModelLoadError
from .decoder import PACKED_MODULES, CausalLM
from .layers import Linear
from .quantized_linear import QuantizedLinear

Target = tuple[str, int | None]  # (parameter name, part of a merged projection or None: all)

# Present in some checkpoints, derived (not learned) here.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def load_weights(model: CausalLM, folder: str | Path) -> None:
    folder = Path(folder)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(
            f"no *.safetensors file in {folder}; the engine loads safetensors checkpoints only"
        )
    modules = dict(model.named_modules())
    quantized = [m for m in modules.values() if isinstance(m, QuantizedLinear)]
    params = dict(model.named_parameters())  # tied weights appear once, under the embedding
    missing = {(name, 0) for name in params}
    for name, module in modules.items():
        if isinstance(module, Linear) and len(module.output_sizes) > 1:
            for p in ("weight", "bias"):
                if f"{name}.{p}" in params:
                    missing.discard((f"{name}.{p}", 0))
                    missing.update((f"{name}.{p}", i) for i in range(len(module.output_sizes)))
    for path in files:
        try:
            with safe_open(path, framework="pt", device="cpu") as f:
                for key in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                    if _quantized_tensor(key, f, modules):
                        continue
                    target = _target(key, params, model)
                    if target is not None:
                        _copy(path, key, f.get_tensor(key), target, modules, params)
                        missing -= _parts(target, modules)
        except (SafetensorError, OSError) as e:
            raise ModelLoadError(
                f"{path} is not a readable safetensors file ({e}); re-download it"
            ) from None
        for module in quantized:  # converted as soon as all their parts are in
            if not module.loaded and module.complete():
                module.finish_loading()
    for module in quantized:  # what is still missing a tensor says which
        if not module.loaded:
            module.finish_loading()
    if missing:
        names = sorted(_checkpoint_name(name, shard, modules) for name, shard in missing)
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        raise ModelLoadError(f"{folder} lacks tensors the model needs: {shown}")


def _quantized_tensor(key: str, f: Any, modules: dict[str, torch.nn.Module]) -> bool:
    """Hand a quantized linear's tensor (not its bias) to its layer; False for any other."""
    module_key, suffix = key.rsplit(".", 1) if "." in key else (key, "")
    if suffix == "bias":
        return False
    name, part = _merged(module_key)
    module = modules.get(name)
    if not isinstance(module, QuantizedLinear):
        return False
    if part is None and len(module.output_sizes) > 1:
        raise ModelLoadError(
            f"checkpoint tensor {key!r} is a fused projection; the engine serves quantized "
            "checkpoints with separate q/k/v and gate/up projections only"
        )
    module.receive(part or 0, suffix, f.get_tensor(key), key)
    return True


def _merged(name: str) -> tuple[str, int | None]:
    """Our module name for a checkpoint module name, and its part of a merged one."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part in PACKED_MODULES:
            merged, shard = PACKED_MODULES[part]
            parts[i] = merged
            return ".".join(parts), shard
    return name, None


def _target(key: str, params: dict[str, torch.nn.Parameter], model: CausalLM) -> Target | None:
    """Our (parameter name, merged part) for a checkpoint tensor name."""
    if key.endswith(IGNORED_SUFFIXES):
        return None
    if key == "lm_head.weight" and model.config.tie_word_embeddings:
        return None  # some tied checkpoints store the head anyway; the embedding is the source
    parts = key.split(".")
    for i, part in enumerate(parts):
        if part in PACKED_MODULES:
            merged, shard = PACKED_MODULES[part]
            parts[i] = merged
            key_ours = ".".join(parts)
            break
    else:  # a plain tensor, or one merged already in the checkpoint (Phi-3's qkv_proj)
        key_ours, shard = key, None
    if key_ours not in params:
        raise ModelLoadError(
            f"checkpoint tensor {key!r} has no place in a {model.config.architecture} with "
            f"{model.config.num_layers} layers; config.json does not match the weights"
        )
    return key_ours, shard


def _copy(
    path: Path,
    key: str,
    tensor: torch.Tensor,
    target: Target,
    modules: dict[str, torch.nn.Module],
    params: dict[str, torch.nn.Parameter],
) -> None:
    name, shard = target
    dest = params[name].data
    module = modules[name.rsplit(".", 1)[0]]
    take_shard = getattr(module, "take_shard", None)  # tensor parallelism: this rank's part
    if take_shard is not None:
        tensor = take_shard(tensor, shard)
    if shard is not None and isinstance(module, Linear) and len(module.output_sizes) > 1:
        dest = dest[module.output_slice(shard)]
    if tuple(tensor.shape) != tuple(dest.shape):
        raise ModelLoadError(
            f"{path.name}: tensor {key!r} has shape {tuple(tensor.shape)}, config.json implies "
            f"{tuple(dest.shape)}"
        )
    if not tensor.dtype.is_floating_point:
        raise ModelLoadError(
            f"{path.name}: tensor {key!r} is {tensor.dtype}; expected floating point"
        )
    dest.copy_(tensor)


def _parts(target: Target, modules: dict[str, torch.nn.Module]) -> set[tuple[str, int]]:
    """The (parameter, part) entries a checkpoint tensor fills: all parts when it is whole."""
    name, shard = target
    if shard is not None:
        return {(name, shard)}
    module = modules[name.rsplit(".", 1)[0]]
    parts = len(module.output_sizes) if isinstance(module, Linear) else 1
    return {(name, i) for i in range(parts)}


def _checkpoint_name(name: str, shard: int, modules: dict[str, torch.nn.Module]) -> str:
    module_name, p = name.rsplit(".", 1)
    module = modules[module_name]
    if isinstance(module, Linear) and len(module.output_sizes) > 1:
        merged = module_name.rsplit(".", 1)[1]
        original = next(k for k, v in PACKED_MODULES.items() if v == (merged, shard))
        return f"{module_name.rsplit('.', 1)[0]}.{original}.{p}"
    return name
