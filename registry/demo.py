"""Demo adapters for `make run`: small LoRA adapters made reproducibly from a seed.

They are not trained; their seeded random weights are scaled so that each one's greedy
answer visibly differs from the base model's while the text stays readable. Written in
exactly the PEFT layout (adapter_config.json + adapter_model.safetensors), they go through
the same upload and validation as any tenant's adapter.
"""

import json
from pathlib import Path

DEMO_ADAPTERS = {
    # name: (seed, rank, target modules, std of A and B)
    "demo-attn": (1, 8, ("q_proj", "v_proj"), 0.06),
    "demo-mlp": (2, 8, ("gate_proj", "up_proj", "down_proj"), 0.05),
    "demo-all": (
        3,
        16,
        ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        0.04,
    ),
}


def write_demo_adapter(
    folder: Path, *, fingerprint, base_name: str, seed: int, rank: int, targets, std: float
):
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(fingerprint.num_layers):
        for module in targets:
            fan_in, fan_out = fingerprint.modules[module]
            kind = (
                "self_attn" if module.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp"
            )
            prefix = f"base_model.model.model.layers.{layer}.{kind}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = (
                torch.randn(rank, fan_in, generator=generator) * std
            )
            tensors[f"{prefix}.lora_B.weight"] = (
                torch.randn(fan_out, rank, generator=generator) * std
            )
    save_file(dict(sorted(tensors.items())), str(folder / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_name,
        "r": rank,
        "lora_alpha": 2 * rank,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": sorted(targets),
        "use_rslora": False,
        "use_dora": False,
        "fan_in_fan_out": False,
    }
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    return folder
