"""Real PEFT adapters for tests: made by `peft.get_peft_model` and saved by `save_pretrained`.

PEFT initialises lora_B to zero, which would make an adapter change nothing; here every
trained tensor is drawn from a seeded generator (LoRA factors, embedding factors; DoRA
magnitudes and whole saved modules are perturbed around their initial values), so each
adapter visibly changes the model's outputs and the same arguments always give the same
bytes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"


def make_peft_adapter(
    base_dir: str | Path,
    out_dir: str | Path,
    *,
    rank: int = 8,
    alpha: int = 16,
    targets: Sequence[str] = ("q_proj", "v_proj"),
    use_rslora: bool = False,
    seed: int = 0,
    std: float = 0.05,
    base_model_name: str | None = None,
    dtype=None,
    **lora_kwargs,
) -> Path:
    """Save a LoRA adapter for the model in `base_dir` into `out_dir`; returns `out_dir`.

    `base_model_name` overrides `base_model_name_or_path` in the saved config (written after
    saving, so PEFT never tries to resolve it on the hub). `dtype` (a torch dtype) loads the
    base, and so the adapter, in that dtype; `lora_kwargs` go to `LoraConfig` as they are.
    """
    import warnings

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    out_dir = Path(out_dir)
    torch.manual_seed(seed)
    kwargs = {"dtype": dtype} if dtype is not None else {}
    model = AutoModelForCausalLM.from_pretrained(str(base_dir), **kwargs)
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        target_modules=list(targets),
        use_rslora=use_rslora,
        lora_dropout=0.0,
        task_type="CAUSAL_LM",
        **lora_kwargs,
    )
    with warnings.catch_warnings():  # transformers' deprecation notes about PEFT's calls
        warnings.simplefilter("ignore", FutureWarning)
        peft_model = get_peft_model(model, config)
    randomize_trained(peft_model, seed, std)
    peft_model.save_pretrained(str(out_dir))
    if base_model_name is not None:
        saved = json.loads((out_dir / CONFIG_FILE).read_text())
        saved["base_model_name_or_path"] = base_model_name
        (out_dir / CONFIG_FILE).write_text(json.dumps(saved, indent=2))
    return out_dir


def randomize_trained(peft_model, seed: int, std: float) -> None:
    """Draw what training would have changed: LoRA factors anew, DoRA magnitudes and
    modules_to_save copies moved around their starting values."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if not ("lora_" in name or "modules_to_save" in name):
                continue
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float32) * std
            if "lora_magnitude_vector" in name:
                param.mul_((1 + 2 * noise).to(param.dtype))
            elif "modules_to_save" in name:
                param.add_(noise.to(param.dtype))
            else:
                param.copy_(noise.to(param.dtype))
