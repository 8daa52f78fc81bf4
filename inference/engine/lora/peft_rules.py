"""What a LoRA adapter may be, so that the engine can apply it exactly.

One place for the rules: the registry's validator calls `check_adapter` on an
upload (header only, no torch, nothing unpickled) and the engine's loader calls
`load_adapter_tensors`, which runs the same checks before it reads a tensor.
The tensors, not `target_modules`, say what is adapted: an adapter whose names
do not match the base model must be refused, never served as the base model.
Every number from the files is bounded before arithmetic and every value is
quoted briefly, so a hostile file gets a report, never an exception.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeGuard

from ..formats.safetensors_header import (
    HeaderError,
    SafetensorsHeader,
    TensorInfo,
    check_finite,
    parse_header,
    show,
)

if TYPE_CHECKING:
    import torch

ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
TARGET_MODULES = ATTENTION_MODULES + MLP_MODULES
PARENT = {m: "self_attn" for m in ATTENTION_MODULES} | {m: "mlp" for m in MLP_MODULES}
FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
KEY_EXAMPLE = "base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight"
# Sane ranges, far beyond real adapters: alpha is usually r or 2r; a 126-layer model's
# adapter on all seven projections has a header of about 250 KB.
MAX_LORA_ALPHA = 2**16
MAX_TARGET_MODULES = 4096
MAX_ADAPTER_HEADER_BYTES = 1024 * 1024
_MAX_LAYER_DIGITS = 6
_MAX_CONFIG_NUMBER_CHARS = 1000  # converting digits costs time quadratic in their count

# PEFT features that change the forward pass in ways the engine does not
# implement: (field, why). A field counts as used unless None/False/empty.
UNSUPPORTED_FIELDS = (
    ("use_dora", "DoRA adapters are not supported; train with use_dora=False"),
    ("modules_to_save", "fully trained modules (modules_to_save) are not supported"),
    ("rank_pattern", "per-module ranks (rank_pattern) are not supported; use one r"),
    ("alpha_pattern", "per-module alphas (alpha_pattern) are not supported; use one lora_alpha"),
    ("fan_in_fan_out", "fan_in_fan_out=True (Conv1D weights) does not fit Llama linear layers"),
    ("lora_bias", "LoRA bias terms (lora_bias=True) are not supported"),
    ("layer_replication", "layer_replication changes the model's layers; not supported"),
    ("trainable_token_indices", "trainable token embeddings are not supported"),
    ("target_parameters", "LoRA on raw parameters (target_parameters) is not supported"),
    ("alora_invocation_tokens", "activated LoRA (alora_invocation_tokens) is not supported"),
    ("use_qalora", "QA-LoRA (use_qalora) is not supported"),
    ("use_bdlora", "block-diagonal LoRA (use_bdlora) is not supported"),
    ("arrow_config", "Arrow routing (arrow_config) is not supported"),
    ("kasa_config", "KaSA (kasa_config) changes the base weights; not supported"),
    ("monteclora_config", "MonteCLoRA (monteclora_config) is not supported"),
)
_EMBEDDING_NAMES = ("embed_tokens", "lm_head")
_LAYER_KEY = re.compile(r"base_model\.model\.(?:model\.)?layers\.(0|[1-9][0-9]*)\.(.+)")
_LORA_WEIGHT = re.compile(r"(.+)\.lora_(A|B)\.weight")

# (layer, module, "A" or "B") -> the tensor's name in the file
FactorNames = dict[tuple[int, str, str], str]


class AdapterError(ValueError):
    """The adapter cannot be served; the message says why."""


class FingerprintError(ValueError):
    """A base model config.json lacks what the engine needs to know."""


# ---------------------------------------------------------------- fingerprint


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

    @property
    def modules(self) -> dict[str, tuple[int, int]]:
        """(in_features, out_features) of each linear a LoRA may target."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {
            "q_proj": (self.hidden, q),
            "k_proj": (self.hidden, kv),
            "v_proj": (self.hidden, kv),
            "o_proj": (q, self.hidden),
            "gate_proj": (self.hidden, self.intermediate),
            "up_proj": (self.hidden, self.intermediate),
            "down_proj": (self.intermediate, self.hidden),
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"modules": {m: list(io) for m, io in self.modules.items()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ArchFingerprint:
        try:
            fp = cls(**{k: d[k] for k in cls.__dataclass_fields__})
        except (KeyError, TypeError) as e:
            raise FingerprintError(f"stored fingerprint is incomplete: missing {e}") from None
        ints = {k: v for k, v in asdict(fp).items() if k != "architecture"}
        if not isinstance(fp.architecture, str) or not all(map(_is_positive_int, ints.values())):
            raise FingerprintError(f"stored fingerprint has invalid values: {d!r}")
        stored = d.get("modules")
        if stored is not None and stored != fp.to_dict()["modules"]:
            raise FingerprintError("stored fingerprint's modules disagree with its dimensions")
        return fp


def fingerprint_from_config(cfg: dict[str, Any]) -> ArchFingerprint:
    """Read a Hugging Face config.json dict of a Llama-family model."""

    def need(key: str) -> int:
        value = cfg.get(key)
        if not _is_positive_int(value):
            raise FingerprintError(f"config.json: {key} must be a positive integer, got {value!r}")
        return value

    archs = cfg.get("architectures")
    architecture = archs[0] if isinstance(archs, list) and archs else cfg.get("model_type")
    if not isinstance(architecture, str):
        raise FingerprintError("config.json names neither architectures nor model_type")
    hidden, heads = need("hidden_size"), need("num_attention_heads")
    kv_heads = need("num_key_value_heads") if cfg.get("num_key_value_heads") else heads
    if cfg.get("head_dim") is not None:
        head_dim = need("head_dim")
    elif hidden % heads == 0:
        head_dim = hidden // heads
    else:
        raise FingerprintError(
            f"config.json: hidden_size {hidden} is not divisible by {heads} heads"
        )
    if heads % kv_heads:
        raise FingerprintError(f"config.json: {heads} heads do not group into {kv_heads} KV heads")
    return ArchFingerprint(
        architecture=architecture,
        num_layers=need("num_hidden_layers"),
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=need("intermediate_size"),
        vocab=need("vocab_size"),
    )


# ---------------------------------------------------------------- report types


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

    rank: int
    lora_alpha: float
    scale: float
    use_rslora: bool
    target_modules: tuple[str, ...]  # present in the tensors, in TARGET_MODULES order
    layers: tuple[int, ...]
    dtype: str
    tensor_names: FactorNames = field(repr=False)
    base_model_name: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        del d["tensor_names"]
        return d | {"target_modules": list(self.target_modules), "layers": list(self.layers)}


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


# ---------------------------------------------------------------- config checks


def parse_config(raw: bytes | str) -> dict[str, Any]:
    """adapter_config.json bytes to a dict, or AdapterError saying what is wrong."""
    try:
        config = json.loads(raw, parse_int=_config_int, parse_float=_config_float)
    except AdapterError:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise AdapterError(f"{CONFIG_FILE} is not valid JSON: {e}") from e
    if not isinstance(config, dict):
        raise AdapterError(f"{CONFIG_FILE} must be a JSON object, not {type(config).__name__}")
    return config


def _too_long(text: str) -> NoReturn:
    digits = len(text) - text.startswith("-")
    raise AdapterError(
        f"{CONFIG_FILE} holds a {digits}-digit number; no PEFT setting needs more than "
        f"{_MAX_CONFIG_NUMBER_CHARS} characters"
    )


def _config_int(text: str) -> int:
    """json's parse_int hook: sees the digits before Python converts them."""
    return _too_long(text) if len(text) > _MAX_CONFIG_NUMBER_CHARS else int(text)


def _config_float(text: str) -> float:
    return _too_long(text) if len(text) > _MAX_CONFIG_NUMBER_CHARS else float(text)


def _config_checks(
    config: dict[str, Any], max_lora_rank: int, expected_base: str | None
) -> list[Check]:
    checks = []
    peft_type = config.get("peft_type")
    checks.append(
        Check("peft_type", True, "LORA")
        if peft_type == "LORA"
        else Check(
            "peft_type", False, f"peft_type is {show(peft_type)}; only LORA adapters are served"
        )
    )
    r = config.get("r")
    if not _is_positive_int(r):
        checks.append(Check("r", False, f"r must be a positive integer, got {show(r)}"))
    elif r > max_lora_rank:
        msg = f"r is {r}, above this platform's maximum LoRA rank {max_lora_rank}; retrain smaller"
        checks.append(Check("r", False, msg))
    else:
        checks.append(Check("r", True, f"rank {r}"))
    alpha = config.get("lora_alpha")
    if _is_number(alpha) and 0 < alpha <= MAX_LORA_ALPHA:
        checks.append(Check("lora_alpha", True, f"lora_alpha {alpha}"))
    else:
        msg = f"lora_alpha must be a positive number up to {MAX_LORA_ALPHA}, got {show(alpha)}"
        checks.append(Check("lora_alpha", False, msg))
    used = [(name, why) for name, why in UNSUPPORTED_FIELDS if not _unset(config.get(name))]
    if config.get("bias", "none") not in ("none", None):
        used.append(
            ("bias", f"bias is {show(config['bias'])}; trained biases are not applied, use 'none'")
        )
    checks += [Check(name, False, f"{name}: {why}") for name, why in used]
    if not used:
        checks.append(Check("peft_features", True, "no unsupported PEFT features"))
    targets = config.get("target_modules")
    names = [targets] if isinstance(targets, str) else targets if isinstance(targets, list) else []
    if len(names) > MAX_TARGET_MODULES:
        msg = f"target_modules lists {len(names)} entries; at most {MAX_TARGET_MODULES}"
        checks.append(Check("target_modules", False, msg))
        names = []
    embedded = sorted({n for n in names if isinstance(n, str) and _is_embedding(n)})
    if embedded:
        checks.append(Check("target_modules", False, _embedding_message(embedded)))
    checks.append(_base_model_check(config.get("base_model_name_or_path"), expected_base))
    task = config.get("task_type")
    if task not in (None, "CAUSAL_LM"):
        msg = (
            f"task_type is {show(task)}; this platform serves causal LMs, the adapter may misbehave"
        )
        checks.append(Check("task_type", False, msg, level="warning"))
    return checks


def _base_model_check(name: object, expected: str | None) -> Check:
    """A warning only: a local path and a hub id may name the same weights."""
    if expected is None:
        return Check("base_model", True, f"trained on {show(name)}", level="warning")
    if not isinstance(name, str) or not name.strip():
        msg = f"the adapter does not say its base model; this platform serves {expected!r}"
        return Check("base_model", False, msg, level="warning")
    if _model_key(name) == _model_key(expected):
        return Check("base_model", True, f"trained on {show(name)}", level="warning")
    msg = f"trained on {show(name)} but this platform serves {expected!r}; outputs may be poor"
    return Check("base_model", False, msg, level="warning")


def _model_key(name: str) -> str:
    """'/models/SmolLM2-135M/' and 'HuggingFaceTB/smollm2-135m' compare equal."""
    return name.strip().rstrip("/").rsplit("/", 1)[-1].lower()


# ---------------------------------------------------------------- tensor checks


def _classify(names: list[str]) -> tuple[FactorNames, dict[str, list[str]]]:
    """Split tensor names into LoRA factors keyed by (layer, module, A|B) and problems."""
    found: FactorNames = {}
    kinds = ("name", "embedding", "dora", "bias", "module", "huge_layer")
    bad: dict[str, list[str]] = {k: [] for k in kinds}
    for name in sorted(names):
        if "lora_embedding" in name or any(f".{e}." in f".{name}." for e in _EMBEDDING_NAMES):
            bad["embedding"].append(name)
        elif "lora_magnitude_vector" in name:
            bad["dora"].append(name)
        elif (m := _LAYER_KEY.fullmatch(name)) is None:
            bad["name"].append(name)
        elif re.fullmatch(r".+\.lora_[AB]\.bias", m[2]):
            bad["bias"].append(name)
        elif (w := _LORA_WEIGHT.fullmatch(m[2])) is None:
            bad["name"].append(name)
        elif len(m[1]) > _MAX_LAYER_DIGITS:  # beyond any model: never converted to an int
            bad["huge_layer"].append(f"{m[1][:12]}… ({len(m[1])} digits)")
        else:
            parent, _, module = w[1].rpartition(".")
            if PARENT.get(module) != parent:
                bad["module"].append(w[1])
            else:
                found[(int(m[1]), module, w[2])] = name
    return found, bad


def _tensor_checks(
    tensors: dict[str, TensorInfo], config: dict[str, Any], fp: ArchFingerprint, max_lora_rank: int
) -> tuple[list[Check], FactorNames]:
    found, bad = _classify(list(tensors))
    present = {module for _, module, _ in found}
    layers = sorted({layer for layer, _, _ in found})
    checks = [
        _listing("tensor_names", bad["name"], f"names must look like {KEY_EXAMPLE}; bad: "),
        _listing("embedding_lora", bad["embedding"], _embedding_message([]) + ": "),
        _listing("dora_tensors", bad["dora"], "DoRA magnitude vectors are not supported: "),
        _listing("lora_bias_tensors", bad["bias"], "LoRA bias tensors are not supported: "),
        _listing(
            "modules",
            sorted(set(bad["module"])),
            f"the base model ({fp.architecture}) has no such module; "
            f"supported: {', '.join(TARGET_MODULES)}; found: ",
            ok="adapts " + (", ".join(m for m in TARGET_MODULES if m in present) or "nothing"),
        ),
    ]
    checks = [c for c in checks if not c.passed or c.name in ("tensor_names", "modules")]
    checks.append(
        _listing(
            "layers",
            [str(i) for i in layers if i >= fp.num_layers] + bad["huge_layer"],
            f"the base model has {fp.num_layers} layers (0-{fp.num_layers - 1}); found layer ",
            ok=f"adapts {len(layers)} of {fp.num_layers} layers",
        )
    )
    unpaired = [
        f"{name} has no lora_{'B' if ab == 'A' else 'A'}"
        for (layer, module, ab), name in found.items()
        if (layer, module, "B" if ab == "A" else "A") not in found
    ]
    checks.append(_listing("pairs", unpaired, "every lora_A needs its lora_B: "))
    dtypes = sorted({tensors[n].dtype for n in found.values()})
    if any(d not in FLOAT_DTYPES for d in dtypes):
        msg = f"LoRA weights must be one of {', '.join(FLOAT_DTYPES)}; found {', '.join(dtypes)}"
        checks.append(Check("dtype", False, msg))
    elif len(dtypes) > 1:
        checks.append(Check("dtype", False, f"LoRA weights mix dtypes {', '.join(dtypes)}"))
    else:
        checks.append(Check("dtype", True, dtypes[0] if dtypes else "no tensors"))
    checks += _shape_checks(found, tensors, config.get("r"), fp, max_lora_rank)
    return checks, found


def _shape_checks(
    found: FactorNames,
    tensors: dict[str, TensorInfo],
    r: object,
    fp: ArchFingerprint,
    max_lora_rank: int,
) -> list[Check]:
    wrong_rank: list[str] = []
    wrong_shape: list[str] = []
    for (layer, module, ab), name in sorted(found.items()):
        shape = tensors[name].shape
        if len(shape) != 2:
            wrong_shape.append(f"{name} is {len(shape)}-D, not a matrix")
            continue
        rank = shape[0] if ab == "A" else shape[1]
        if _is_positive_int(r) and rank != r:
            wrong_rank.append(f"{name} has rank {rank} but r is {r}")
        elif rank > max_lora_rank:
            wrong_rank.append(f"{name} has rank {rank}, above the maximum {max_lora_rank}")
        if module in fp.modules and layer < fp.num_layers:
            fan_in, fan_out = fp.modules[module]
            want = (rank, fan_in) if ab == "A" else (fan_out, rank)
            if shape != want:
                wrong_shape.append(f"{name} is {list(shape)}, the base model needs {list(want)}")
    return [
        _listing("tensor_rank", wrong_rank, ""),
        _listing("shapes", wrong_shape, "shapes do not fit the base model: "),
    ]


def _finite_check(bad: list[str]) -> Check:
    return _listing("finite", bad, "weights contain NaN or Inf (diverged training?): ")


def _listing(name: str, problems: list[str], prefix: str, ok: str = "ok", limit: int = 5) -> Check:
    if not problems:
        return Check(name, True, ok)
    more = f" and {len(problems) - limit} more" if len(problems) > limit else ""
    return Check(name, False, prefix + ", ".join(map(_clip, problems[:limit])) + more)


def _clip(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _is_embedding(target: str) -> bool:
    return target.rsplit(".", 1)[-1] in _EMBEDDING_NAMES


def _embedding_message(targets: list[str]) -> str:
    more = f" and {len(targets) - 5} more" if len(targets) > 5 else ""
    listed = f" ({', '.join(_clip(t, 60) for t in targets[:5])}{more})" if targets else ""
    return (
        f"LoRA on embed_tokens or lm_head{listed} is not supported; adapt linear projections only"
    )


# ---------------------------------------------------------------- entry points


def check_adapter(
    config: dict[str, Any] | bytes | str,
    header: SafetensorsHeader,
    fingerprint: ArchFingerprint,
    *,
    max_lora_rank: int,
    weights_path: str | os.PathLike[str] | None = None,
    expected_base_name: str | None = None,
) -> AdapterReport:
    """Every rule, as a report a person can read; with weights_path, values are checked too."""
    if not isinstance(config, dict):
        try:
            config = parse_config(config)
        except AdapterError as e:
            return AdapterReport([Check("config", False, str(e))])
    checks = _config_checks(config, max_lora_rank, expected_base_name)
    tensor_checks, found = _tensor_checks(header.tensors, config, fingerprint, max_lora_rank)
    checks += tensor_checks
    if weights_path is not None:
        try:
            checks.append(_finite_check(check_finite(weights_path, header)))
        except (HeaderError, OSError) as e:
            checks.append(Check("finite", False, f"cannot read the weights: {e}"))
    pairs = sum(1 for k in found if k[2] == "A")
    if pairs:
        checks.append(Check("adapts_something", True, f"{pairs} LoRA pairs"))
    else:
        msg = "no LoRA tensors for this base model: the adapter would change nothing"
        checks.append(Check("adapts_something", False, msg))
    report = AdapterReport(checks)
    if report.ok:
        report.spec = _spec(config, header, found)
    return report


def _spec(config: dict[str, Any], header: SafetensorsHeader, found: FactorNames) -> AdapterSpec:
    r, alpha, rslora = config["r"], config["lora_alpha"], bool(config.get("use_rslora"))
    present = {module for _, module, _ in found}
    return AdapterSpec(
        rank=r,
        lora_alpha=alpha,
        scale=alpha / math.sqrt(r) if rslora else alpha / r,
        use_rslora=rslora,
        target_modules=tuple(m for m in TARGET_MODULES if m in present),
        layers=tuple(sorted({layer for layer, _, _ in found})),
        dtype=header.tensors[next(iter(found.values()))].dtype,
        tensor_names=dict(found),
        base_model_name=config.get("base_model_name_or_path"),
    )


def load_adapter_tensors(
    folder: str | os.PathLike[str],
    fingerprint: ArchFingerprint,
    *,
    max_lora_rank: int,
    expected_base_name: str | None = None,
) -> tuple[AdapterSpec, dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]]:
    """Check a PEFT folder, then read its factors as CPU torch tensors.

    Returns (spec, {(layer, module): (A [r, in], B [out, r])}). Values are checked
    with torch after loading, so the file is read once.
    """
    folder = Path(folder)
    for file in (CONFIG_FILE, WEIGHTS_FILE):
        if not (folder / file).is_file():
            raise AdapterError(f"{file} is missing from {folder}")
    config = parse_config((folder / CONFIG_FILE).read_bytes())
    try:
        header = parse_header(folder / WEIGHTS_FILE, max_header_bytes=MAX_ADAPTER_HEADER_BYTES)
    except HeaderError as e:
        raise AdapterError(f"{WEIGHTS_FILE}: {e}") from e
    report = check_adapter(
        config,
        header,
        fingerprint,
        max_lora_rank=max_lora_rank,
        expected_base_name=expected_base_name,
    )
    spec = require_valid(report)

    import torch
    from safetensors import safe_open

    loaded: dict[tuple[int, str, str], torch.Tensor] = {}
    with safe_open(folder / WEIGHTS_FILE, framework="pt", device="cpu") as f:
        for key, name in spec.tensor_names.items():
            loaded[key] = f.get_tensor(name)
    nonfinite = [spec.tensor_names[k] for k, t in loaded.items() if not torch.isfinite(t).all()]
    if nonfinite:
        raise AdapterError(f"adapter refused: finite: {_finite_check(sorted(nonfinite)).message}")
    pairs = {(layer, module) for layer, module, _ in loaded}
    return spec, {
        (layer, module): (loaded[(layer, module, "A")], loaded[(layer, module, "B")])
        for layer, module in sorted(pairs)
    }


def _is_positive_int(x: object) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0


def _is_number(x: object) -> TypeGuard[int | float]:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return False
    return isinstance(x, int) or math.isfinite(x)


def _unset(value: object) -> bool:
    return value is None or value is False or value == {} or value == [] or value == ""
