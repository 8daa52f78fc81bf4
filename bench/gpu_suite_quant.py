"""Decode speed over quantized bases: the served model (Llama-3-8B shapes) quantized on the
device to FP8 (per-channel e4m3 weights, dynamic per-token activations) and to W4A16 (4-bit
integers, groups of 128), written as compressed-tensors checkpoints with the engine's own
packing (no llmcompressor on the device image), and served with 32 adapters at each batch
size beside the unquantized (bf16) base.

Decode reads every weight once a step, so a smaller resident base should read faster; the
LoRA shrink and expand on top stay in the compute dtype and cost the same in every row.
"""

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from gpu_suite_context import Context
from gpu_suite_lora import load_adapters, lora_decode
from safetensors import safe_open
from safetensors.torch import save_file

SCHEMES = ("fp8-dynamic", "w4a16")
GROUPS = (128, 64, 32)  # the largest that divides every projection's inputs (128 at 8B)
FP8_MAX = 448.0
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_WEIGHTS = {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True,
            "dynamic": False, "group_size": None, "actorder": None}  # fmt: skip
_TOKENS = {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True,
           "dynamic": True}  # fmt: skip


def group_size(config: dict[str, Any]) -> int:
    sizes = (config["hidden_size"], config["intermediate_size"])
    return next(g for g in GROUPS if all(n % g == 0 for n in sizes))


def quantization_config(scheme: str, group: int) -> dict[str, Any]:
    """config.json's quantization_config, as llmcompressor writes it for `scheme`."""
    fp8 = scheme.startswith("fp8")
    int4 = {"num_bits": 4, "type": "int", "strategy": "group", "symmetric": True,
            "dynamic": False, "group_size": group, "actorder": None}  # fmt: skip
    config = {"targets": ["Linear"], "weights": _WEIGHTS if fp8 else int4,
              "input_activations": _TOKENS if fp8 else None, "output_activations": None,
              "format": "float-quantized" if fp8 else "pack-quantized"}  # fmt: skip
    return {"quant_method": "compressed-tensors", "format": config["format"],
            "quantization_status": "compressed", "config_groups": {"group_0": config},
            "ignore": ["lm_head"], "kv_cache_scheme": None, "sparsity_config": {},
            "transform_config": {}}  # fmt: skip


def quantize_linear(weight: torch.Tensor, scheme: str, size: int) -> dict[str, torch.Tensor]:
    """One [out, in] weight as the checkpoint stores it (suffix -> tensor), on its device."""
    from inference.engine.model.quantized_formats import pack_int32

    w = weight.float()
    if scheme.startswith("fp8"):
        scale = (w.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp(min=1e-12)
        q = (w / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        return {"weight": q, "weight_scale": scale.to(weight.dtype)}
    out_features, in_features = w.shape
    groups = w.reshape(out_features, in_features // size, size)
    scale = (groups.abs().amax(dim=2) / 7).clamp(min=1e-12)
    q = (groups / scale.unsqueeze(2)).round().clamp(-8, 7).to(torch.int32) + 8  # stored q + 8
    with torch.device(weight.device):  # its buffers on the device too: seconds, not minutes
        packed = pack_int32(q.reshape(out_features, in_features), 4)
    return {"weight_packed": packed, "weight_scale": scale.to(weight.dtype),
            "weight_shape": torch.tensor([out_features, in_features])}  # fmt: skip


def write_quantized(served: Path, folder: Path, scheme: str, device: torch.device) -> int:
    """The served model's checkpoint with every decoder projection quantized by `scheme`
    (embeddings, norms and the head as they are); returns the bytes written."""
    folder.mkdir(parents=True, exist_ok=True)
    for path in served.iterdir():
        tensors_file = path.suffix == ".safetensors" or path.name.endswith(".index.json")
        if path.is_file() and not tensors_file:
            shutil.copy(path, folder / path.name)
    config = json.loads((served / "config.json").read_text())
    size = group_size(config)
    config["quantization_config"] = quantization_config(scheme, size)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    written = 0
    for shard in sorted(served.glob("*.safetensors")):
        tensors: dict[str, torch.Tensor] = {}
        with safe_open(str(shard), framework="pt", device=str(device)) as f:
            for name in f.keys():  # noqa: SIM118 (a safe_open handle)
                tensor = f.get_tensor(name)
                module = name.removesuffix(".weight")
                if name.endswith(".weight") and module.rsplit(".", 1)[-1] in PROJECTIONS:
                    for suffix, t in quantize_linear(tensor, scheme, size).items():
                        tensors[f"{module}.{suffix}"] = t.contiguous().cpu()
                else:
                    tensors[name] = tensor.cpu()
        save_file(tensors, str(folder / shard.name), metadata={"format": "pt"})
        written += sum(t.numel() * t.element_size() for t in tensors.values())
    index = served / "model.safetensors.index.json"
    if index.exists():  # the shards keep their names; the index maps the new tensor names
        mapping: dict[str, str] = {}
        for shard in sorted(folder.glob("*.safetensors")):
            with safe_open(str(shard), framework="pt") as f:
                mapping |= {name: shard.name for name in f.keys()}  # noqa: SIM118
        (folder / index.name).write_text(json.dumps({"metadata": {}, "weight_map": mapping}))
    return written


def _rows(ctx: Context, folder: Path, adapters: list[Path]) -> dict[str, Any]:
    """Decode tokens/s at each batch size, request i on adapter i mod len(adapters)."""
    from inference.engine.model.quantized_linear import weight_bytes

    p = ctx.profile
    n = len(adapters)
    engine = ctx.engine(folder, enable_lora=True, max_loras=n, max_cpu_loras=n,
                        max_lora_rank=16, max_num_seqs=max(p.batches))  # fmt: skip
    try:
        requests = load_adapters(engine, adapters)
        resident, _ = weight_bytes(engine.model_runner.model)
        scheme = engine.config.model_config.quantization
        rows = []
        for batch in p.batches:
            batch_requests = [requests[i % n] for i in range(batch)]
            try:
                rows.append(lora_decode(engine, batch_requests, p.prompt_len, p.warm_steps,
                                        p.decode_steps))  # fmt: skip
            except Exception as error:  # one batch size failing leaves the others
                rows.append({"batch": batch, "error": f"{type(error).__name__}: {error}"})
    finally:
        engine.close()
    return {"scheme": None if scheme is None else scheme.name,
            "weight_bytes": resident, "rows": rows}  # fmt: skip


def quant_decode(ctx: Context) -> dict[str, Any]:
    adapters = ctx.adapters()
    figures: dict[str, Any] = {"adapters": len(adapters), "schemes": {}}
    for scheme in SCHEMES:
        folder = ctx.workdir / f"served-{scheme}"
        try:
            written = write_quantized(ctx.served, folder, scheme, ctx.device)
            figures["schemes"][scheme] = {"checkpoint_bytes": written,
                                          **_rows(ctx, folder, adapters)}  # fmt: skip
        except Exception as error:
            figures["schemes"][scheme] = {"error": f"{type(error).__name__}: {error}"}
        shutil.rmtree(folder, ignore_errors=True)
    figures["schemes"]["unquantized"] = _rows(ctx, ctx.served, adapters)  # bf16 on the GPU
    rows = figures["schemes"]["unquantized"]["rows"]
    base = {r["batch"]: r for r in rows if "error" not in r}
    for scheme in SCHEMES:
        for row in figures["schemes"][scheme].get("rows", []):
            if "error" not in row and row["batch"] in base:
                row["over_unquantized"] = round(
                    row["tokens_per_s"] / base[row["batch"]]["tokens_per_s"], 3
                )
    return figures
