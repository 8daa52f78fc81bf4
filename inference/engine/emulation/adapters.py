"""Adapters for a simulated deployment's tenants: PEFT folders for the served model, with
random factors (the emulated device never computes with them; their files, loads, host
copies and slots are real), made once and reused."""

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..fingerprint import fingerprint_from_config


def tenant_adapters(
    served: Path, root: Path, count: int, rank: int, targets: tuple[str, ...]
) -> list[Path]:
    """`count` adapters of `rank` on `targets` for the model in `served`, under `root`."""
    config = json.loads((served / "config.json").read_text())
    fingerprint = fingerprint_from_config(config, source=str(served / "config.json"))
    modules = {m: io for m, io in fingerprint.modules.items() if m in targets}
    folder_root = root / f"{served.name}-r{rank}-{'-'.join(sorted(modules))}"
    folders = [folder_root / f"tenant-{i:03d}" for i in range(count)]
    for i, folder in enumerate(folders):
        if (folder / "adapter_model.safetensors").is_file():
            continue
        generator = torch.Generator().manual_seed(i)
        tensors = {}
        for layer in range(fingerprint.num_layers):
            for module, (fan_in, fan_out) in modules.items():
                name = f"base_model.model.{fingerprint.module_path(layer, module)}"
                a = torch.randn(rank, fan_in, generator=generator) / fan_in**0.5
                tensors[f"{name}.lora_A.weight"] = a.to(torch.bfloat16)
                b = torch.randn(fan_out, rank, generator=generator) * 0.01
                tensors[f"{name}.lora_B.weight"] = b.to(torch.bfloat16)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "adapter_config.json").write_text(
            json.dumps(
                {
                    "peft_type": "LORA",
                    "task_type": "CAUSAL_LM",
                    "r": rank,
                    "lora_alpha": 2 * rank,
                    "lora_dropout": 0.0,
                    "target_modules": sorted(modules),
                    "bias": "none",
                    "base_model_name_or_path": served.name,
                }
            )
        )
        save_file(tensors, str(folder / "adapter_model.safetensors"))
    return folders
