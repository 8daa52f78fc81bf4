"""config.json's `quantization_config`, as llmcompressor, AutoAWQ and GPTQ write it, read
into a QuantizationScheme; what the engine cannot serve is refused here, with the reason,
so that a base model is turned away at import and never fails later at serve."""

from __future__ import annotations

import re
from typing import Any

from .scheme import (
    ALL_LINEARS,
    GROUP_SIZES,
    LM_HEAD,
    ActivationQuant,
    Format,
    Granularity,
    QuantizationError,
    QuantizationScheme,
    WeightQuant,
)

SERVED = (
    "compressed-tensors float-quantized (FP8 weights, activations dynamic per token, static "
    "per tensor or unquantized), compressed-tensors pack-quantized (4 or 8-bit integer "
    f"weights, per channel or in groups of {', '.join(map(str, GROUP_SIZES))}), AutoAWQ GEMM "
    "(4-bit) and GPTQ (4 or 8-bit)"
)
_ACTORDER = {None: False, False: False, True: True, "group": True, "dynamic": True}
_ACTORDER |= {"weight": False, "static": False}  # reorders calibration, not the layout


def parse_quantization(
    config: dict[str, Any], source: str = "config.json"
) -> QuantizationScheme | None:
    """The scheme of a config.json dict; None for an unquantized model."""
    qc = config.get("quantization_config")
    if qc is None:
        return None
    where = f"{source}: quantization_config"
    if not isinstance(qc, dict):
        raise QuantizationError(f"{where} must be a JSON object, got {qc!r:.80}")
    method = qc.get("quant_method")
    readers = {"compressed-tensors": _compressed_tensors, "awq": _awq, "gptq": _gptq}
    reader = readers.get(method if isinstance(method, str) else "")
    if reader is None:
        raise QuantizationError(
            f"{where}: quant_method {method!r} is not served; the engine serves {SERVED}"
        )
    scheme = reader(qc, where)
    if scheme.is_quantized(LM_HEAD):
        raise QuantizationError(
            f"{where} quantizes lm_head; the engine keeps the head in the compute dtype "
            "(quantize with lm_head ignored)"
        )
    return scheme


def _compressed_tensors(qc: dict[str, Any], where: str) -> QuantizationScheme:
    for key, what in (
        ("sparsity_config", "sparsity"),
        ("kv_cache_scheme", "KV-cache quantization"),
        ("transform_config", "transforms (rotations)"),
    ):
        if qc.get(key):
            raise QuantizationError(f"{where} has {what} ({key}); the engine does not serve it")
    status = qc.get("quantization_status", "compressed")
    if status != "compressed":
        raise QuantizationError(
            f"{where}: quantization_status {status!r}; the engine reads compressed checkpoints "
            "only (save with save_compressed=True)"
        )
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise QuantizationError(f"{where} has no config_groups")
    schemes: dict[QuantizationScheme, list[str]] = {}
    targets: list[str] = []
    for label, group in groups.items():
        if not isinstance(group, dict):
            raise QuantizationError(f"{where}: config_groups.{label} must be a JSON object")
        fmt = group.get("format") or qc.get("format")
        scheme = _group(group, fmt, f"{where}: config_groups.{label}")
        schemes.setdefault(scheme, []).append(label)
        targets += _patterns(group.get("targets"), f"{where}: config_groups.{label}.targets")
    if len(schemes) > 1:
        kinds = "; ".join(f"{', '.join(labels)}: {s.name}" for s, labels in schemes.items())
        raise QuantizationError(
            f"{where} mixes schemes across config_groups ({kinds}); the engine serves one "
            "scheme for every quantized linear"
        )
    ignore = _patterns(qc.get("ignore") or [], f"{where}: ignore")
    scheme = next(iter(schemes))
    return QuantizationScheme(
        method=scheme.method,
        format=scheme.format,
        weights=scheme.weights,
        activations=scheme.activations,
        targets=tuple(targets),
        ignore=tuple(ignore),
    )


def _group(group: dict[str, Any], fmt: object, where: str) -> QuantizationScheme:
    """One config group's scheme (targets and ignore filled in by the caller)."""
    if group.get("output_activations"):
        raise QuantizationError(f"{where} quantizes output activations; not served")
    weights = group.get("weights")
    if not isinstance(weights, dict):
        raise QuantizationError(f"{where} quantizes no weights; not served")
    w = _weights(weights, f"{where}.weights")
    acts = group.get("input_activations")
    a = None if acts is None else _activations(acts, f"{where}.input_activations")
    layout: Format
    if fmt == "float-quantized":
        layout = "float-quantized"
        if w.type != "float":
            raise QuantizationError(
                f"{where}: float-quantized holds FP8 weights, but weights.type is {w.type!r}"
            )
    elif fmt == "pack-quantized":
        layout = "pack-quantized"
        if w.type != "int":
            raise QuantizationError(
                f"{where}: pack-quantized holds integer weights, but weights.type is {w.type!r}"
            )
        if a is not None:
            raise QuantizationError(
                f"{where}: integer weights with quantized activations (W{w.bits}A8) are not "
                "served; the engine serves integer weights with 16-bit activations"
            )
    else:
        raise QuantizationError(
            f"{where}: format {fmt!r} is not served; the engine serves {SERVED}"
        )
    if w.type == "float" and w.granularity == "group":
        raise QuantizationError(f"{where}: FP8 weights with group scales are not served")
    return QuantizationScheme(method="compressed-tensors", format=layout, weights=w, activations=a)


def _weights(args: dict[str, Any], where: str) -> WeightQuant:
    kind = _kind(args, where)
    bits: Any = args.get("num_bits")
    if bits not in ((8,) if kind == "float" else (4, 8)) or isinstance(bits, bool):
        raise QuantizationError(
            f"{where}: {bits!r}-bit {kind} weights are not served "
            f"({'8-bit FP8' if kind == 'float' else '4 or 8-bit'} only)"
        )
    if args.get("dynamic"):
        raise QuantizationError(f"{where}: dynamic weight scales are not served")
    if args.get("block_structure") is not None or args.get("strategy") == "block":
        raise QuantizationError(
            f"{where}: block-wise scales are not served (per channel, per group or per tensor)"
        )
    granularity, group_size = _granularity(args.get("strategy"), args.get("group_size"), where)
    if kind == "float" and not args.get("symmetric", True):
        raise QuantizationError(f"{where}: asymmetric FP8 weights are not served")
    actorder = args.get("actorder")
    if actorder not in _ACTORDER:
        raise QuantizationError(f"{where}: actorder {actorder!r} is not known")
    return WeightQuant(
        bits=bits,
        type=kind,
        granularity=granularity,
        group_size=group_size,
        symmetric=bool(args.get("symmetric", True)),
        actorder=_ACTORDER[actorder] and granularity == "group",
    )


def _activations(args: object, where: str) -> ActivationQuant:
    if not isinstance(args, dict):
        raise QuantizationError(f"{where} must be a JSON object or null")
    kind, bits = _kind(args, where), args.get("num_bits")
    strategy, dynamic = args.get("strategy"), args.get("dynamic")
    if kind != "float" or bits != 8 or not args.get("symmetric", True):
        raise QuantizationError(
            f"{where}: {bits!r}-bit {kind} activations are not served (FP8, symmetric, only)"
        )
    if (strategy, dynamic) not in (("token", True), ("tensor", False)):
        raise QuantizationError(
            f"{where}: FP8 activations with strategy {strategy!r} and dynamic {dynamic!r} are "
            "not served; the engine serves dynamic per-token or static per-tensor scales"
        )
    per_token = strategy == "token"
    return ActivationQuant(
        bits=8, type="float", dynamic=per_token, granularity="token" if per_token else "tensor"
    )


def _kind(args: dict[str, Any], where: str) -> Any:
    kind = args.get("type", "int")
    if kind not in ("int", "float"):
        raise QuantizationError(f"{where}: type {kind!r} is not int or float")
    return kind


def _granularity(
    strategy: object, group_size: object, where: str
) -> tuple[Granularity, int | None]:
    if strategy is None:  # compressed-tensors infers it from the group size
        strategy = "tensor" if group_size is None else "channel" if group_size == -1 else "group"
    if strategy == "group":
        return "group", _group_size(group_size, where)
    if strategy not in ("tensor", "channel"):
        raise QuantizationError(
            f"{where}: strategy {strategy!r} is not served (tensor, channel or group)"
        )
    if group_size not in (None, -1):
        raise QuantizationError(f"{where}: strategy {strategy!r} with a group_size")
    return ("tensor" if strategy == "tensor" else "channel"), None


def _group_size(group_size: object, where: str) -> int:
    if group_size not in GROUP_SIZES or isinstance(group_size, bool):
        raise QuantizationError(
            f"{where}: group size {group_size!r} is not served; the engine serves groups of "
            f"{', '.join(map(str, GROUP_SIZES))} or per-channel scales"
        )
    assert isinstance(group_size, int)
    return group_size


def _patterns(value: object, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        raise QuantizationError(f"{where} must be a list of module names or patterns")
    for pattern in value:
        if pattern.startswith("re:"):
            try:
                re.compile(pattern[3:])
            except re.error as e:
                raise QuantizationError(f"{where}: {pattern!r} is not a regex ({e})") from None
        elif pattern != ALL_LINEARS and "." not in pattern and pattern != LM_HEAD:
            raise QuantizationError(
                f"{where}: {pattern!r} names neither a module nor 'Linear'; the engine "
                "quantizes linear layers only"
            )
    return value


def _awq(qc: dict[str, Any], where: str) -> QuantizationScheme:
    version = str(qc.get("version", "gemm")).lower()
    if version != "gemm":
        raise QuantizationError(
            f"{where}: AWQ version {qc.get('version')!r} is not served (GEMM only)"
        )
    bits = qc.get("bits", qc.get("w_bit"))
    if bits != 4 or isinstance(bits, bool):
        raise QuantizationError(f"{where}: {bits!r}-bit AWQ is not served (4-bit only)")
    if not qc.get("zero_point", True):
        raise QuantizationError(f"{where}: AWQ without zero points is not served")
    group_size = _group_size(qc.get("group_size", qc.get("q_group_size")), where)
    skipped = _names(qc.get("modules_to_not_convert"), f"{where}: modules_to_not_convert")
    return QuantizationScheme(
        method="awq",
        format="awq-gemm",
        weights=WeightQuant(4, "int", "group", group_size, symmetric=False, actorder=False),
        activations=None,
        ignore=_names_as_patterns(skipped),
    )


def _gptq(qc: dict[str, Any], where: str) -> QuantizationScheme:
    checkpoint_format = qc.get("checkpoint_format", "gptq")
    if checkpoint_format != "gptq":
        raise QuantizationError(
            f"{where}: GPTQ checkpoint_format {checkpoint_format!r} is not served (gptq only)"
        )
    bits = qc.get("bits")
    if bits not in (4, 8) or isinstance(bits, bool):
        raise QuantizationError(f"{where}: {bits!r}-bit GPTQ is not served (4 or 8-bit)")
    if qc.get("lm_head"):
        raise QuantizationError(f"{where} quantizes lm_head; not served")
    if qc.get("dynamic"):
        raise QuantizationError(f"{where}: per-module overrides (dynamic) are not served")
    group_size = qc.get("group_size", 128)
    granularity: Granularity = "channel" if group_size == -1 else "group"
    size = None if granularity == "channel" else _group_size(group_size, where)
    skipped = _names(qc.get("modules_to_not_convert"), f"{where}: modules_to_not_convert")
    return QuantizationScheme(
        method="gptq",
        format="gptq",
        weights=WeightQuant(
            bits,
            "int",
            granularity,
            size,
            symmetric=bool(qc.get("sym", True)),
            actorder=bool(qc.get("desc_act", False)) and granularity == "group",
        ),
        activations=None,
        ignore=_names_as_patterns(skipped),
    )


def _names(value: object, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(n, str) and n for n in value):
        raise QuantizationError(f"{where} must be a list of module names")
    return value


def _names_as_patterns(names: list[str]) -> tuple[str, ...]:
    """AutoAWQ and GPTQ skip a module when its name contains an entry ("lm_head", "gate"):
    as compressed-tensors patterns, one regex each (lm_head is never quantized there)."""
    return (LM_HEAD, *(f"re:.*{re.escape(n)}" for n in names if n != LM_HEAD))
