"""Tiny random models of every family the engine serves, made by transformers from a config.

Each family gets its own small shapes (so an adapter of one family never fits another's base
by accident, as with real checkpoints) and turns on what sets it apart: Qwen2's q/k/v bias,
Qwen3's and Gemma 3's per-head q/k norms, Gemma's soft-capping and alternating sliding-window
layers, Phi-3's fused projections and LongRoPE. Windows are a few tokens wide so short test
prompts already cross them. Biases and norm weights, which transformers initialises to
constants, are drawn at random so a mistake in either shows in the logits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tests.tiny_llama import build_tokenizer, write_tokenizer_config

ROPE_HALF = 8  # Phi-3: head_dim 16, 8 rotary frequencies

# family -> (transformers config class, model class, config keywords)
FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"hidden_size": 64}),
    "mistral": (
        "MistralConfig",
        "MistralForCausalLM",
        {"hidden_size": 64, "num_key_value_heads": 1, "sliding_window": 8},
    ),
    "qwen2": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        # the last layer slides (Qwen2 slides from layer max_window_layers on)
        {
            "hidden_size": 96,
            "use_sliding_window": True,
            "sliding_window": 8,
            "max_window_layers": 1,
        },
    ),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"hidden_size": 80, "head_dim": 16}),
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        {
            "hidden_size": 72,
            "head_dim": 16,
            "query_pre_attn_scalar": 24,
            "sliding_window": 8,
            "attn_logit_softcapping": 4.0,
            "final_logit_softcapping": 6.0,
        },
    ),
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {
            "hidden_size": 56,
            "head_dim": 16,
            "query_pre_attn_scalar": 20,
            "sliding_window": 8,
            "layer_types": ["sliding_attention", "full_attention"],
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
            },
        },
    ),
    "phi3": (
        "Phi3Config",
        "Phi3ForCausalLM",
        {
            "hidden_size": 128,
            "num_attention_heads": 8,
            "original_max_position_embeddings": 32,
            "rope_parameters": {
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "short_factor": [1.0 + 0.1 * i for i in range(ROPE_HALF)],
                "long_factor": [1.0 + 0.9 * i for i in range(ROPE_HALF)],
            },
            "sliding_window": 24,
        },
    ),
}


def make_tiny_model(
    path: str | Path,
    family: str,
    *,
    num_layers: int = 2,
    max_positions: int = 128,
    init_std: float = 0.1,
    seed: int = 0,
    **overrides: Any,
) -> Path:
    """Save a seeded random fp32 model of `family` and the tests' tokenizer in `path`.

    `overrides` replace the family's config keywords (e.g. sliding_window=None)."""
    import transformers

    config_name, model_name, family_kwargs = FAMILIES[family]
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    tokenizer.save(str(path / "tokenizer.json"))
    kwargs: dict[str, Any] = {
        "vocab_size": tokenizer.get_vocab_size(),
        "intermediate_size": 96,
        "num_hidden_layers": num_layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": max_positions,
        "initializer_range": init_std,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": None,
        **family_kwargs,
        **overrides,
    }
    config = getattr(transformers, config_name)(**kwargs)
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config).to(torch.float32).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                param.add_(torch.randn_like(param) * init_std)
    model.save_pretrained(path)
    write_tokenizer_config(path, max_positions)
    return path
