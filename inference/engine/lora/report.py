"""The verdict on an adapter: named checks a person can read, and what the engine needs to
serve it (AdapterSpec) when every check passed."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .tensor_names import FactorNames, ModuleKey


class AdapterError(ValueError):
    """The adapter cannot be served; the message says why."""


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    message: str
    level: str = "error"  # "error" refuses the adapter; "warning" is only reported

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class AdapterSpec:
    """What the engine needs to place an adapter into a slot."""

    rank: int  # r of the config; modules may differ (rank_pattern), see max_rank
    lora_alpha: float
    scale: float  # the scale of a module no pattern matches
    use_rslora: bool
    target_modules: tuple[str, ...]  # as the tensors name them: layer modules, then heads
    layers: tuple[int, ...]
    dtype: str
    tensor_names: FactorNames = field(repr=False)
    base_model_name: str | None = None
    max_rank: int = 0  # the largest rank of any module
    use_dora: bool = False
    saved_modules: tuple[str, ...] = ()  # embed_tokens / lm_head served from the adapter's copy
    # (layer, module as the file names it) -> its scale (alpha / r, or / sqrt(r) with rsLoRA)
    module_scales: dict[ModuleKey, float] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        del d["tensor_names"], d["module_scales"]
        return d | {
            "target_modules": list(self.target_modules),
            "layers": list(self.layers),
            "saved_modules": list(self.saved_modules),
        }


@dataclass
class AdapterReport:
    checks: list[Check]
    spec: AdapterSpec | None = None

    @property
    def ok(self) -> bool:
        return all(c.passed for c in self.checks if c.level == "error")

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.passed and c.level == "error"]

    @property
    def warnings(self) -> list[Check]:
        return [c for c in self.checks if not c.passed and c.level == "warning"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "checks": [c.to_dict() for c in self.checks],
            "spec": self.spec.to_dict() if self.spec else None,
        }


def require_valid(report: AdapterReport) -> AdapterSpec:
    """The spec of a passing report; AdapterError listing the failures otherwise."""
    if report.ok and report.spec is not None:
        return report.spec
    lines = "; ".join(f"{c.name}: {c.message}" for c in report.failures)
    raise AdapterError(f"adapter refused: {lines or 'no usable LoRA tensors'}")


def listing(name: str, problems: list[str], prefix: str, ok: str = "ok", limit: int = 5) -> Check:
    if not problems:
        return Check(name, True, ok)
    more = f" and {len(problems) - limit} more" if len(problems) > limit else ""
    return Check(name, False, prefix + ", ".join(map(clip, problems[:limit])) + more)


def clip(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[:limit] + "…"
