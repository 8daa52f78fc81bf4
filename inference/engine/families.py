"""What sets each served model family apart, read from its config.json.

One decoder (model/decoder.py) serves every family; the differences are a handful of
switches: where biases sit, per-head q/k norms, Gemma's `(1 + w)` norms around both
sublayers, its scaled embeddings, GeGLU and soft-capping, and which layers attend through a
sliding window. Each switch is derived here from the Hugging Face config, the way
transformers derives it, so the model code never asks which family it is running.
"""

from typing import Any

from .errors import ModelLoadError

# architecture in config.json -> family
FAMILIES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
    "Phi3ForCausalLM": "phi3",
}
GEMMA = ("gemma2", "gemma3")
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
SLIDING, FULL = "sliding_attention", "full_attention"


def family_traits(raw: dict[str, Any], family: str, num_layers: int, source: str) -> dict[str, Any]:
    """The ModelConfig fields that differ between families."""
    gemma = family in GEMMA
    act = raw.get("hidden_activation") or raw.get("hidden_act") or "silu"
    if act not in ACTIVATIONS:
        raise ModelLoadError(
            f"{source}: activation {act!r} is not supported ({', '.join(ACTIVATIONS)})"
        )
    attention_bias = bool(raw.get("attention_bias", False))
    hidden = int(raw["hidden_size"])
    return {
        "family": family,
        "qkv_bias": family == "qwen2" or attention_bias,
        "o_bias": attention_bias,
        "mlp_bias": bool(raw.get("mlp_bias", False)),
        "qk_norm": family in ("qwen3", "gemma3"),
        "norm_offset": 1.0 if gemma else 0.0,
        "sandwich_norms": gemma,
        "hidden_act": act,
        "embed_scale": hidden**0.5 if gemma else None,
        "attn_softcap": _positive_or_none(raw, "attn_logit_softcapping", source),
        "final_softcap": _positive_or_none(raw, "final_logit_softcapping", source),
        "query_pre_attn_scalar": _positive_or_none(raw, "query_pre_attn_scalar", source),
        "layer_windows": _layer_windows(raw, family, num_layers, source),
    }


def _positive_or_none(raw: dict[str, Any], key: str, source: str) -> float | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ModelLoadError(f"{source}: {key} must be a positive number, got {value!r}")
    return float(value)


def layer_types(raw: dict[str, Any], family: str, num_layers: int) -> list[str]:
    """Sliding or full attention per layer: config.json's `layer_types` when it has them
    (transformers 5 writes them), else each family's rule for older configs."""
    if raw.get("layer_types"):
        return list(raw["layer_types"])
    window = raw.get("sliding_window")
    if not window:
        return [FULL] * num_layers
    if family == "gemma2":  # even layers slide
        return [SLIDING if i % 2 == 0 else FULL for i in range(num_layers)]
    if family == "gemma3":  # every `sliding_window_pattern`-th layer is global
        pattern = int(raw.get("sliding_window_pattern") or 6)
        return [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(num_layers)]
    if family in ("qwen2", "qwen3"):  # layers from max_window_layers on, when switched on
        start = int(raw.get("max_window_layers") or 0)
        on = bool(raw.get("use_sliding_window"))
        return [SLIDING if on and i >= start else FULL for i in range(num_layers)]
    return [SLIDING] * num_layers  # Mistral, Phi-3: every layer


def _layer_windows(
    raw: dict[str, Any], family: str, num_layers: int, source: str
) -> tuple[int | None, ...]:
    types = layer_types(raw, family, num_layers)
    if len(types) != num_layers or any(t not in (SLIDING, FULL) for t in types):
        raise ModelLoadError(
            f"{source}: layer_types must list {num_layers} of {SLIDING!r} / {FULL!r}"
        )
    window = raw.get("sliding_window")
    if SLIDING in types and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ModelLoadError(
            f"{source}: sliding layers need a positive integer sliding_window, got {window!r}"
        )
    return tuple(window if t == SLIDING else None for t in types)
