"""The base model's shapes an adapter must fit, and the names its projections go by.

The registry stores a fingerprint per base model (`to_dict`) and checks uploads against it
without loading the model; the engine computes one from the config.json it serves. Most
families name seven projections per layer (q/k/v/o, gate/up/down). Phi-3 checkpoints store
q/k/v and gate/up fused (`qkv_proj`, `gate_up_proj`), and PEFT adapters for Phi-3 name the
fused modules, so the table of modules depends on the architecture. The engine always
serves the unfused slices; `slices` says how a fused module's rows split into them.

A quantized checkpoint's scheme is part of the fingerprint: the same shapes at FP8 or
4-bit are another base for an adapter's quality, though its tensors still fit.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, TypeGuard

from .families import FAMILIES
from .quantization.parse import parse_quantization
from .quantization.scheme import QuantizationError, QuantizationScheme
from .quantization.shapes import check_model_shapes

ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
TARGET_MODULES = ATTENTION_MODULES + MLP_MODULES  # the engine's slices, in model order
# fused module -> the engine slices its output rows hold, in order
FUSED_MODULES = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}
FUSED_TARGETS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
PARENT = {m: "self_attn" for m in (*ATTENTION_MODULES, "qkv_proj")} | {
    m: "mlp" for m in (*MLP_MODULES, "gate_up_proj")
}
# Modules outside the layers that an adapter may change: LoRA on them, or a full copy.
HEAD_MODULES = ("embed_tokens", "lm_head")
# Architectures (or model types) whose checkpoints, and so whose adapters, fuse projections.
FUSED_ARCHITECTURES = ("Phi3ForCausalLM", "phi3")
_MODEL_TYPES = {"gemma3_text": "gemma3"}


class FingerprintError(ValueError):
    """A base model config.json lacks what the engine needs to know."""


@dataclass(frozen=True)
class ArchFingerprint:
    """The base model's shapes an adapter must fit; stored by the registry as JSON."""

    architecture: str
    num_layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    quantization: QuantizationScheme | None = None  # None: weights in a float dtype

    @property
    def fused(self) -> bool:
        """Whether adapters name fused qkv_proj / gate_up_proj (Phi-3)."""
        return self.architecture in FUSED_ARCHITECTURES

    @property
    def family(self) -> str | None:
        return family_of(self.architecture)

    @property
    def modules(self) -> dict[str, tuple[int, int]]:
        """(in_features, out_features) of each layer linear an adapter may name."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        if self.fused:
            return {
                "qkv_proj": (self.hidden, q + 2 * kv),
                "o_proj": (q, self.hidden),
                "gate_up_proj": (self.hidden, 2 * self.intermediate),
                "down_proj": (self.intermediate, self.hidden),
            }
        return {
            "q_proj": (self.hidden, q),
            "k_proj": (self.hidden, kv),
            "v_proj": (self.hidden, kv),
            "o_proj": (q, self.hidden),
            "gate_proj": (self.hidden, self.intermediate),
            "up_proj": (self.hidden, self.intermediate),
            "down_proj": (self.intermediate, self.hidden),
        }

    def slices(self, module: str) -> list[tuple[str, int]]:
        """(engine slice, rows) of a module's output, in order: one slice unless fused."""
        fused = FUSED_MODULES.get(module)
        if fused is None:
            return [(module, self.modules[module][1])]
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        rows = [q, kv, kv] if module == "qkv_proj" else [self.intermediate] * 2
        return list(zip(fused, rows, strict=True))

    def module_path(self, layer: int, module: str) -> str:
        """A layer linear's full name in the checkpoint: model.layers.0.mlp.down_proj."""
        return f"model.layers.{layer}.{PARENT[module]}.{module}"

    def to_dict(self) -> dict[str, Any]:
        """The stored form; an unquantized model's has no "quantization" key, as before
        quantized bases were served."""
        d: dict[str, Any] = {f: getattr(self, f) for f in _DIMENSIONS}
        if self.quantization is not None:
            d["quantization"] = self.quantization.canonical()
        return d | {"modules": {m: list(io) for m, io in self.modules.items()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ArchFingerprint:
        try:
            dims = {k: d[k] for k in _DIMENSIONS}
            quantized = d.get("quantization")
            scheme = None if quantized is None else QuantizationScheme.from_canonical(quantized)
            fp = cls(**dims, quantization=scheme)
        except (KeyError, TypeError) as e:
            raise FingerprintError(f"stored fingerprint is incomplete: missing {e}") from None
        except QuantizationError as e:
            raise FingerprintError(str(e)) from None
        ints = [v for k, v in dims.items() if k != "architecture"]
        if not isinstance(fp.architecture, str) or not all(map(is_positive_int, ints)):
            raise FingerprintError(f"stored fingerprint has invalid values: {d!r}")
        stored = d.get("modules")
        if stored is not None and stored != fp.to_dict()["modules"]:
            raise FingerprintError("stored fingerprint's modules disagree with its dimensions")
        return fp


_DIMENSIONS = tuple(f.name for f in fields(ArchFingerprint) if f.name != "quantization")


def family_of(architecture: object) -> str | None:
    """The model family of an architecture class name or model type; None if unknown."""
    if not isinstance(architecture, str):
        return None
    name = _MODEL_TYPES.get(architecture, architecture)
    return FAMILIES.get(name) or (name if name in FAMILIES.values() else None)


def fingerprint_from_config(cfg: dict[str, Any], source: str = "config.json") -> ArchFingerprint:
    """Read a Hugging Face config.json dict of a served model family; `source` names the file
    in the errors. A quantization the engine cannot serve raises QuantizationError."""

    def need(key: str) -> int:
        value = cfg.get(key)
        if not is_positive_int(value):
            raise FingerprintError(f"{source}: {key} must be a positive integer, got {value!r:.80}")
        return value

    archs = cfg.get("architectures")
    architecture = archs[0] if isinstance(archs, list) and archs else cfg.get("model_type")
    if not isinstance(architecture, str):
        raise FingerprintError(f"{source} names neither architectures nor model_type")
    hidden, heads = need("hidden_size"), need("num_attention_heads")
    kv_heads = need("num_key_value_heads") if cfg.get("num_key_value_heads") else heads
    if cfg.get("head_dim") is not None:
        head_dim = need("head_dim")
    elif hidden % heads == 0:
        head_dim = hidden // heads
    else:
        raise FingerprintError(f"{source}: hidden_size {hidden} is not divisible by {heads} heads")
    if heads % kv_heads:
        raise FingerprintError(f"{source}: {heads} heads do not group into {kv_heads} KV heads")
    fingerprint = ArchFingerprint(
        architecture=architecture,
        num_layers=need("num_hidden_layers"),
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=need("intermediate_size"),
        vocab=need("vocab_size"),
        quantization=parse_quantization(cfg, source),
    )
    if fingerprint.quantization is not None:
        try:
            check_model_shapes(fingerprint.quantization, fingerprint)
        except QuantizationError as e:
            raise QuantizationError(f"{source}: {e}") from None
    return fingerprint


def is_positive_int(x: object) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0
