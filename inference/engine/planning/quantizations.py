"""The quantizations a plan may ask for, as the schemes the engine serves (what
llmcompressor's FP8_DYNAMIC, W8A16 and W4A16 recipes write): every layer linear quantized,
embeddings and lm_head left in the compute dtype."""

import dataclasses

from ..model_config import ModelConfig
from ..quantization import ActivationQuant, QuantizationScheme, WeightQuant

BF16 = "bf16"
SCHEMES: dict[str, QuantizationScheme | None] = {
    BF16: None,
    "fp8": QuantizationScheme(
        method="compressed-tensors",
        format="float-quantized",
        weights=WeightQuant(8, "float", "channel", None, symmetric=True, actorder=False),
        activations=ActivationQuant(8, "float", dynamic=True, granularity="token"),
    ),
    "w8a16": QuantizationScheme(
        method="compressed-tensors",
        format="pack-quantized",
        weights=WeightQuant(8, "int", "channel", None, symmetric=True, actorder=False),
        activations=None,
    ),
    "w4a16": QuantizationScheme(
        method="compressed-tensors",
        format="pack-quantized",
        weights=WeightQuant(4, "int", "group", 128, symmetric=True, actorder=False),
        activations=None,
    ),
}
# weakest to strongest: what the planner suggests next when weights do not fit
ORDER = tuple(SCHEMES)


def with_quantization(mc: ModelConfig, name: str | None) -> ModelConfig:
    """The model as served with `name` (None: as its config.json says)."""
    if name is None:
        return mc
    if name not in SCHEMES:
        raise ValueError(f"unknown quantization {name!r}; known: {', '.join(SCHEMES)}")
    fingerprint = dataclasses.replace(mc.fingerprint, quantization=SCHEMES[name])
    return dataclasses.replace(mc, fingerprint=fingerprint)


def quantization_name(mc: ModelConfig) -> str:
    """The plan's name for the model's scheme: one of SCHEMES, else the scheme's own name."""
    scheme = mc.quantization
    for name, known in SCHEMES.items():
        if known == scheme:
            return name
    assert scheme is not None
    return scheme.name
