"""The PEFT LoRA variants the registry tests upload, on the tiny models of several families.

Each is a real PEFT adapter (tests/peft_adapters.py): DoRA, per-module ranks and alphas, LoRA
on embed_tokens and lm_head, and whole copies of either head (modules_to_save), on Llama,
Qwen2 (q/k/v bias), Gemma 2 (tied embeddings) and Phi-3 (PEFT targets its fused qkv_proj and
gate_up_proj).
"""

from pathlib import Path
from typing import Any

from django.core.management import call_command

from tests.peft_adapters import make_peft_adapter

VARIANTS = (
    "dora",
    "rank_pattern",
    "alpha_pattern",
    "embedding_lora",
    "modules_to_save_lm_head",
    "modules_to_save_embed_tokens",
)
VARIANT_FAMILIES = ("llama", "qwen2", "gemma2", "phi3")


def variant_kwargs(family: str, variant: str) -> dict[str, Any]:
    """make_peft_adapter's arguments for `variant` on `family` (whose projections PEFT
    names qkv_proj and gate_up_proj on Phi-3)."""
    attn, other = ("qkv_proj", "gate_up_proj") if family == "phi3" else ("q_proj", "v_proj")
    plain: dict[str, Any] = {"targets": (attn, other)}
    kwargs: dict[str, dict[str, Any]] = {
        "dora": plain | {"use_dora": True},
        # a suffix and a layer-qualified key, both as PEFT matches them; r is 4
        "rank_pattern": plain | {"rank_pattern": {other: 8, f"layers.1.self_attn.{attn}": 2}},
        "alpha_pattern": plain | {"alpha_pattern": {other: 64, f"layers.0.self_attn.{attn}": 4}},
        "embedding_lora": {"targets": (attn, "embed_tokens", "lm_head")},
        "modules_to_save_lm_head": plain | {"modules_to_save": ["lm_head"]},
        "modules_to_save_embed_tokens": plain | {"modules_to_save": ["embed_tokens"]},
    }
    return kwargs[variant]


def make_variant(base_dir: Path, out_dir: Path, family: str, variant: str) -> Path:
    """A PEFT adapter of `variant` (r 4, alpha 8 unless the variant says otherwise) for the
    tiny model of `family` in `base_dir`; it says it was trained on `tiny-<family>`."""
    kwargs = {"rank": 4, "alpha": 8} | variant_kwargs(family, variant)
    return make_peft_adapter(base_dir, out_dir, base_model_name=f"tiny-{family}", **kwargs)


def import_family(family: str, folder: Path) -> str:
    """`manage.py import_base_model --hf-dir` as `tiny-<family>`, served; returns the name."""
    name = f"tiny-{family}"
    call_command("import_base_model", "--hf-dir", str(folder), "--name", name, "--default")
    return name
