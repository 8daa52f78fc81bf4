"""What a LoRA adapter may be, so that the engine can apply it exactly.

One place for the rules: the registry's validator calls `check_adapter` on an
upload (header only, no torch, nothing unpickled) and the engine's loader calls
`load_adapter`, which runs the same checks before it reads a tensor.
The tensors, not `target_modules`, say what is adapted: an adapter whose names
do not match the base model must be refused, never served as the base model.
Every number from the files is bounded before arithmetic and every value is
quoted briefly, so a hostile file gets a report, never an exception.

Served: LoRA on every layer projection (per-module rank and alpha from `rank_pattern` /
`alpha_pattern`, rsLoRA), DoRA (`use_dora`: a magnitude vector per adapted module), LoRA on
`embed_tokens` and `lm_head`, and full copies of those two (`modules_to_save`) up to
`max_saved_params` parameters (LORAPLEX_MAX_SAVED_MODULE_PARAMS). Phi-3 adapters name
fused `qkv_proj` / `gate_up_proj`; they are split here into the engine's q/k/v and gate/up
slices (A shared, B split by rows).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeGuard

from ..fingerprint import (
    ATTENTION_MODULES,
    HEAD_MODULES,
    MLP_MODULES,
    TARGET_MODULES,
    ArchFingerprint,
    FingerprintError,
    fingerprint_from_config,
    is_positive_int,
)
from ..formats.safetensors_header import (
    HeaderError,
    SafetensorsHeader,
    check_finite,
    parse_header,
    show,
)
from ..formats.untrusted_json import load_object
from .patterns import MAX_PATTERN_ENTRIES, pattern_problem
from .report import AdapterError, AdapterReport, AdapterSpec, Check, listing, require_valid
from .tensor_checks import (
    FLOAT_DTYPES,
    KEY_EXAMPLE,
    SAVED_MODULE_PARAMS_ENV,
    ModuleRules,
    module_order,
    tensor_checks,
)
from .tensor_names import (
    BASE_COPY,
    HEAD_LAYER,
    MAGNITUDE,
    SAVED,
    ClassifiedNames,
    FactorNames,
    ModuleKey,
)
from .tensor_names import A as PART_A
from .tensor_names import B as PART_B

if TYPE_CHECKING:
    import torch

__all__ = [
    "ATTENTION_MODULES",
    "AdapterError",
    "AdapterReport",
    "AdapterSpec",
    "AdapterTensors",
    "ArchFingerprint",
    "CONFIG_FILE",
    "Check",
    "FLOAT_DTYPES",
    "FactorNames",
    "FingerprintError",
    "HEAD_LAYER",
    "HEAD_MODULES",
    "KEY_EXAMPLE",
    "MAX_ADAPTER_HEADER_BYTES",
    "MAX_LORA_ALPHA",
    "MAX_TARGET_MODULES",
    "MLP_MODULES",
    "SAVED_MODULE_PARAMS_ENV",
    "TARGET_MODULES",
    "WEIGHTS_FILE",
    "check_adapter",
    "fingerprint_from_config",
    "load_adapter",
    "load_adapter_tensors",
    "parse_config",
    "require_valid",
]

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# Sane ranges, far beyond real adapters: alpha is usually r or 2r; a 126-layer model's
# adapter on all seven projections has a header of about 250 KB.
MAX_LORA_ALPHA = 2**16
MAX_TARGET_MODULES = 4096
MAX_ADAPTER_HEADER_BYTES = 1024 * 1024
_MAX_CONFIG_NUMBER_CHARS = 1000  # converting digits costs time quadratic in their count
# A full copy of embed_tokens or lm_head is served per adapter when it is this small: 2**25
# parameters (64 MiB in bf16) holds SmolLM2's 49152 x 576 head; a 7B model's does not fit.
DEFAULT_MAX_SAVED_MODULE_PARAMS = 2**25

# PEFT features that change the forward pass in ways the engine does not
# implement: (field, why). A field counts as used unless None/False/empty.
UNSUPPORTED_FIELDS = (
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


# ---------------------------------------------------------------- config checks


def parse_config(raw: bytes | str) -> dict[str, Any]:
    """adapter_config.json bytes to a dict, or AdapterError saying what is wrong."""
    return load_object(
        raw, CONFIG_FILE, AdapterError, parse_int=_config_int, parse_float=_config_float
    )


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
    if not is_positive_int(r):
        checks.append(Check("r", False, f"r must be a positive integer, got {show(r)}"))
    elif r > max_lora_rank:
        msg = f"r is {r}, above this platform's maximum LoRA rank {max_lora_rank}; retrain smaller"
        checks.append(Check("r", False, msg))
    else:
        checks.append(Check("r", True, f"rank {r}"))
    alpha = config.get("lora_alpha")
    if _is_alpha(alpha):
        checks.append(Check("lora_alpha", True, f"lora_alpha {alpha}"))
    else:
        msg = f"lora_alpha must be a positive number up to {MAX_LORA_ALPHA}, got {show(alpha)}"
        checks.append(Check("lora_alpha", False, msg))
    checks += _pattern_checks(config, max_lora_rank)
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
    checks.append(_base_model_check(config.get("base_model_name_or_path"), expected_base))
    task = config.get("task_type")
    if task not in (None, "CAUSAL_LM"):
        msg = (
            f"task_type is {show(task)}; this platform serves causal LMs, the adapter may misbehave"
        )
        checks.append(Check("task_type", False, msg, level="warning"))
    return checks


def _pattern_checks(config: dict[str, Any], max_lora_rank: int) -> list[Check]:
    """rank_pattern / alpha_pattern: safe keys (see patterns.py) and sane values."""
    checks = []
    for name in ("rank_pattern", "alpha_pattern"):
        raw = config.get(name)
        if _unset(raw):
            continue
        if not isinstance(raw, dict):
            msg = f"{name} must map module name patterns to numbers, got {show(raw)}"
            checks.append(Check(name, False, msg))
            continue
        if len(raw) > MAX_PATTERN_ENTRIES:
            msg = f"{name} has {len(raw)} entries; at most {MAX_PATTERN_ENTRIES}"
            checks.append(Check(name, False, msg))
            continue
        problems = []
        for key, value in raw.items():
            problem = pattern_problem(key)
            if problem is not None:
                problems.append(f"key {show(key)} {problem}")
            elif name == "rank_pattern" and not is_positive_int(value):
                problems.append(
                    f"{show(key)}: a rank must be a positive integer, got {show(value)}"
                )
            elif name == "rank_pattern" and value > max_lora_rank:
                problems.append(
                    f"{show(key)} gets rank {value}, above this platform's maximum LoRA rank "
                    f"{max_lora_rank}"
                )
            elif name == "alpha_pattern" and not _is_alpha(value):
                problems.append(
                    f"{show(key)}: alpha must be a positive number up to {MAX_LORA_ALPHA}, "
                    f"got {show(value)}"
                )
        what = "ranks" if name == "rank_pattern" else "alphas"
        checks.append(listing(name, problems, f"{name}: ", ok=f"{len(raw)} per-module {what}"))
    return checks


def _valid_pattern(config: dict[str, Any], name: str, checks: list[Check]) -> dict[str, Any]:
    """The pattern to apply: {} when unset or refused (its own check reports why)."""
    raw = config.get(name)
    refused = any(c.name == name and not c.passed for c in checks)
    return raw if isinstance(raw, dict) and not refused else {}


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


def _finite_check(bad: list[str]) -> Check:
    return listing("finite", bad, "weights contain NaN or Inf (diverged training?): ")


# ---------------------------------------------------------------- entry points


def check_adapter(
    config: dict[str, Any] | bytes | str,
    header: SafetensorsHeader,
    fingerprint: ArchFingerprint,
    *,
    max_lora_rank: int,
    weights_path: str | os.PathLike[str] | None = None,
    expected_base_name: str | None = None,
    max_saved_params: int | None = None,
) -> AdapterReport:
    """Every rule, as a report a person can read; with weights_path, values are checked too.

    `max_saved_params` bounds a whole embed_tokens / lm_head copy (default
    DEFAULT_MAX_SAVED_MODULE_PARAMS; the platform passes LORAPLEX_MAX_SAVED_MODULE_PARAMS)."""
    if not isinstance(config, dict):
        try:
            config = parse_config(config)
        except AdapterError as e:
            return AdapterReport([Check("config", False, str(e))])
    if max_saved_params is None:
        max_saved_params = DEFAULT_MAX_SAVED_MODULE_PARAMS
    checks = _config_checks(config, max_lora_rank, expected_base_name)
    rules = ModuleRules(
        r=config.get("r"),
        alpha=config.get("lora_alpha"),
        rslora=bool(config.get("use_rslora")),
        rank_pattern=_valid_pattern(config, "rank_pattern", checks),
        alpha_pattern=_valid_pattern(config, "alpha_pattern", checks),
    )
    more, names = tensor_checks(
        header.tensors, config, rules, fingerprint, max_lora_rank, max_saved_params
    )
    checks += more
    if weights_path is not None:
        try:
            checks.append(_finite_check(check_finite(weights_path, header)))
        except (HeaderError, OSError) as e:
            checks.append(Check("finite", False, f"cannot read the weights: {e}"))
    pairs = sum(1 for k in names.found if k[2] == PART_A)
    saved = sum(1 for k in names.found if k[2] == SAVED)
    if pairs or saved:
        whole = f" and {saved} whole modules" if saved else ""
        checks.append(Check("adapts_something", True, f"{pairs} LoRA pairs{whole}"))
    else:
        msg = "no LoRA tensors for this base model: the adapter would change nothing"
        checks.append(Check("adapts_something", False, msg))
    # an adapter made for another model family: say so first, its shape details follow
    checks.sort(key=lambda c: c.passed or c.name != "architecture")
    report = AdapterReport(checks)
    if report.ok:
        report.spec = _spec(config, header, names, rules, fingerprint)
    return report


def _spec(
    config: dict[str, Any],
    header: SafetensorsHeader,
    names: ClassifiedNames,
    rules: ModuleRules,
    fp: ArchFingerprint,
) -> AdapterSpec:
    r, alpha, rslora = config["r"], config["lora_alpha"], rules.rslora
    found = names.found
    pairs = sorted({(layer, module) for layer, module, part in found if part == PART_A})
    ranks = [header.tensors[found[(*key, PART_A)]].shape[0] for key in pairs]
    factors = [n for (_, _, p), n in found.items() if p in (PART_A, PART_B)]
    return AdapterSpec(
        rank=r,
        lora_alpha=alpha,
        scale=alpha / math.sqrt(r) if rslora else alpha / r,
        use_rslora=rslora,
        target_modules=tuple(module_order({m for _, m, _ in found}, fp)),
        layers=tuple(sorted({layer for layer, _, _ in found if layer != HEAD_LAYER})),
        dtype=header.tensors[(factors or list(found.values()))[0]].dtype,
        tensor_names=dict(found),
        base_model_name=config.get("base_model_name_or_path"),
        max_rank=max(ranks, default=0),
        use_dora=any(p == MAGNITUDE for _, _, p in found),
        saved_modules=tuple(m for m in HEAD_MODULES if (HEAD_LAYER, m, SAVED) in found),
        module_scales={key: rules.scale(names.paths[key]) for key in pairs},
    )


@dataclass
class AdapterTensors:
    """An adapter's tensors as CPU torch tensors, keyed by the engine's modules (a fused
    Phi-3 module is split into its q/k/v or gate/up slices)."""

    factors: dict[ModuleKey, tuple[torch.Tensor, torch.Tensor]]  # (A [r, in], B [out, r])
    scales: dict[ModuleKey, float]  # every module with factors, heads included
    magnitudes: dict[ModuleKey, torch.Tensor] = field(default_factory=dict)  # DoRA m [out]
    # embed_tokens: (A [r, vocab], B [hidden, r]); lm_head: (A [r, hidden], B [vocab, r])
    heads: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    saved: dict[str, torch.Tensor] = field(default_factory=dict)  # whole module [vocab, hidden]
    base_copies: dict[str, torch.Tensor] = field(default_factory=dict)  # base_layer copies


def load_adapter(
    folder: str | os.PathLike[str],
    fingerprint: ArchFingerprint,
    *,
    max_lora_rank: int,
    expected_base_name: str | None = None,
    max_saved_params: int | None = None,
) -> tuple[AdapterSpec, AdapterTensors]:
    """Check a PEFT folder, then read its tensors as CPU torch tensors. Values are checked
    with torch after loading, so the file is read once."""
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
        max_saved_params=max_saved_params,
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
    return spec, _engine_tensors(spec, loaded, fingerprint)


def _engine_tensors(
    spec: AdapterSpec, loaded: dict[tuple[int, str, str], torch.Tensor], fp: ArchFingerprint
) -> AdapterTensors:
    out = AdapterTensors(factors={}, scales={})
    for (layer, module), scale in spec.module_scales.items():
        a, b = loaded[(layer, module, PART_A)], loaded[(layer, module, PART_B)]
        magnitude = loaded.get((layer, module, MAGNITUDE))
        if layer == HEAD_LAYER:
            out.heads[module] = (a, b)
            out.scales[(layer, module)] = scale
            if magnitude is not None:
                out.magnitudes[(layer, module)] = magnitude
            continue
        start = 0
        for piece, rows in fp.slices(module):  # a fused module: A shared, B split by rows
            key = (layer, piece)
            out.factors[key] = (a, b[start : start + rows])
            out.scales[key] = scale
            if magnitude is not None:
                out.magnitudes[key] = magnitude[start : start + rows]
            start += rows
    for (_, module, part), tensor in loaded.items():
        if part == SAVED:
            out.saved[module] = tensor
        elif part == BASE_COPY:
            out.base_copies[module] = tensor
    return out


def load_adapter_tensors(
    folder: str | os.PathLike[str],
    fingerprint: ArchFingerprint,
    *,
    max_lora_rank: int,
    expected_base_name: str | None = None,
) -> tuple[AdapterSpec, dict[ModuleKey, tuple[torch.Tensor, torch.Tensor]]]:
    """The spec and the layer linears' factors {(layer, module): (A [r, in], B [out, r])}."""
    spec, tensors = load_adapter(
        folder, fingerprint, max_lora_rank=max_lora_rank, expected_base_name=expected_base_name
    )
    return spec, tensors.factors


def _is_alpha(x: object) -> TypeGuard[int | float]:
    return _is_number(x) and 0 < x <= MAX_LORA_ALPHA


def _is_number(x: object) -> TypeGuard[int | float]:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return False
    return isinstance(x, int) or math.isfinite(x)


def _unset(value: object) -> bool:
    return value is None or value is False or value == {} or value == [] or value == ""
