"""What a quantized checkpoint holds, in the engine's own terms, whichever tool wrote it.

compressed-tensors (llmcompressor), AutoAWQ and GPTQ describe the same few things in
different words; `parse.py` reads each into one `QuantizationScheme`, and the loader, the
kernels and the registry read only this. Its `name` is short and stable (it is shown to
operators and stored with the base model); two schemes that differ in anything the
loader or the kernels care about have different names.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any, Literal

from ..errors import ModelLoadError

Method = Literal["compressed-tensors", "awq", "gptq"]
# How the weights are laid out on disk: compressed-tensors' float-quantized (FP8 e4m3
# tensors) or pack-quantized (ints packed into int32 along the input dim), AutoAWQ's GEMM
# packing, GPTQ's (v1) packing.
Format = Literal["float-quantized", "pack-quantized", "awq-gemm", "gptq"]
WeightType = Literal["int", "float"]
Granularity = Literal["tensor", "channel", "group"]
GROUP_SIZES = (32, 64, 128)
# compressed-tensors names every nn.Linear with this target; AWQ and GPTQ quantize all of
# the layers' linears, so they are given it too.
ALL_LINEARS = "Linear"
LM_HEAD = "lm_head"


class QuantizationError(ModelLoadError):
    """A checkpoint's quantization the engine cannot serve; the message says why."""


@dataclass(frozen=True)
class WeightQuant:
    """How each quantized linear's weight is stored."""

    bits: int  # 4 or 8
    type: WeightType  # "float": FP8 e4m3; "int": packed integers
    granularity: Granularity  # one scale for the tensor, per output channel, or per group
    group_size: int | None  # input columns a scale covers; None unless granularity="group"
    symmetric: bool  # False: zero points are stored beside the scales
    actorder: bool  # columns grouped in activation order (a g_idx per input column)


@dataclass(frozen=True)
class ActivationQuant:
    """How a layer's input is quantized before the GEMM (FP8 schemes only)."""

    bits: int  # 8
    type: WeightType  # "float"
    dynamic: bool  # True: a scale per token computed at run time; False: one stored scale
    granularity: Literal["token", "tensor"]


@dataclass(frozen=True)
class QuantizationScheme:
    """One base model's quantization. `targets` and `ignore` are compressed-tensors' module
    patterns (exact names, "re:" regular expressions, or "Linear" for every linear)."""

    method: Method
    format: Format
    weights: WeightQuant
    activations: ActivationQuant | None  # None: weight-only (activations in compute dtype)
    targets: tuple[str, ...] = (ALL_LINEARS,)
    ignore: tuple[str, ...] = (LM_HEAD,)

    def __post_init__(self) -> None:
        # Patterns match in any order: kept sorted, so equal schemes compare (and hash) equal.
        object.__setattr__(self, "targets", tuple(sorted(set(self.targets))))
        object.__setattr__(self, "ignore", tuple(sorted(set(self.ignore))))

    @property
    def weight_only(self) -> bool:
        return self.activations is None

    @property
    def name(self) -> str:
        """Short and stable: fp8-dynamic, w4a16-g128, w4a16-g128-asym, w8a16-channel,
        awq-w4-g128, gptq-w4-g128-actorder, ..."""
        w, a = self.weights, self.activations
        if w.type == "float":
            acts = "weight-only" if a is None else "dynamic" if a.dynamic else "static"
            return f"fp8-{acts}" + ("-tensor" if w.granularity == "tensor" else "")
        per = f"g{w.group_size}" if w.granularity == "group" else w.granularity
        prefix = {"compressed-tensors": f"w{w.bits}a16", "awq": f"awq-w{w.bits}"}.get(
            self.method, f"{self.method}-w{w.bits}"
        )
        asym = "-asym" if not w.symmetric and self.method != "awq" else ""
        return f"{prefix}-{per}{asym}{'-actorder' if w.actorder else ''}"

    def is_quantized(self, module: str) -> bool:
        """Whether the linear of this full name (`model.layers.0.mlp.down_proj`,
        `lm_head`) is stored quantized."""
        return _matches(module, self.targets) and not _matches(module, self.ignore)

    def canonical(self) -> dict[str, Any]:
        """Everything that identifies the scheme, as sorted JSON-ready values: stored in the
        base model's fingerprint, equal for equal schemes whatever wrote the config."""
        return {
            "name": self.name,
            "method": self.method,
            "format": self.format,
            "weights": asdict(self.weights),
            "activations": None if self.activations is None else asdict(self.activations),
            "targets": list(self.targets),
            "ignore": list(self.ignore),
        }

    @classmethod
    def from_canonical(cls, d: dict[str, Any]) -> QuantizationScheme:
        """The scheme `canonical()` wrote; QuantizationError if the dict is not one."""
        try:
            acts = d["activations"]
            scheme = cls(
                method=d["method"],
                format=d["format"],
                weights=WeightQuant(**d["weights"]),
                activations=None if acts is None else ActivationQuant(**acts),
                targets=tuple(d["targets"]),
                ignore=tuple(d["ignore"]),
            )
        except (KeyError, TypeError) as e:
            raise QuantizationError(f"stored quantization scheme is incomplete: {e}") from None
        if scheme.canonical() != d:
            raise QuantizationError(f"stored quantization scheme is inconsistent: {d!r:.200}")
        return scheme


def _matches(module: str, patterns: tuple[str, ...]) -> bool:
    for pattern in patterns:
        if pattern in (ALL_LINEARS, module):
            return True
        if pattern.startswith("re:") and re.match(pattern[3:], module):
            return True
    return False
