"""The rules on an adapter's tensors, from the header alone: what each tensor is
(tensor_names.py), whether the base model has that module, and the shape, rank, dtype and
companions (lora_B for lora_A, DoRA magnitudes) it needs."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

from ..fingerprint import (
    FUSED_MODULES,
    HEAD_MODULES,
    PARENT,
    ArchFingerprint,
    family_of,
    is_positive_int,
)
from ..formats.safetensors_header import TensorInfo, show
from .patterns import first_match
from .report import Check, clip, listing
from .tensor_names import (
    BASE_COPY,
    HEAD_LAYER,
    MAGNITUDE,
    SAVED,
    ClassifiedNames,
    FactorNames,
    classify,
)
from .tensor_names import A as PART_A
from .tensor_names import B as PART_B

FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")
KEY_EXAMPLE = "base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight"
SAVED_MODULE_PARAMS_ENV = "LORAPLEX_MAX_SAVED_MODULE_PARAMS"
# layer modules whose input is the hidden state (the rest read attention or MLP outputs)
_READS_HIDDEN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", *FUSED_MODULES)


@dataclass(frozen=True)
class ModuleRules:
    """What the config says about each module: its rank, alpha and how PEFT scales it."""

    r: object
    alpha: object
    rslora: bool
    rank_pattern: dict[str, Any]
    alpha_pattern: dict[str, Any]

    def rank(self, path: str) -> tuple[object, str | None]:
        """(expected rank, the rank_pattern key that set it or None)."""
        key = first_match(self.rank_pattern, path)
        return (self.r, None) if key is None else (self.rank_pattern[key], key)

    def scale(self, path: str) -> float:
        rank, _ = self.rank(path)
        key = first_match(self.alpha_pattern, path)
        alpha = self.alpha if key is None else self.alpha_pattern[key]
        assert is_positive_int(rank) and isinstance(alpha, int | float)  # checked for the spec
        return alpha / math.sqrt(rank) if self.rslora else alpha / rank


def tensor_checks(
    tensors: dict[str, TensorInfo],
    config: dict[str, Any],
    rules: ModuleRules,
    fp: ArchFingerprint,
    max_lora_rank: int,
    max_saved_params: int,
) -> tuple[list[Check], ClassifiedNames]:
    """Every check on the tensors, and their names sorted out (modules the base lacks left
    out of `found`)."""
    names = classify(list(tensors))
    implied = _implied_shapes(names, tensors)  # before modules the base lacks are set aside
    found = names.found
    misplaced = [
        key
        for key in found
        if key[0] != HEAD_LAYER
        and (key[1] not in fp.modules or PARENT.get(key[1]) != _parent(names, *key[:2]))
    ]
    wrong_module = sorted({f"{_parent(names, *key[:2])}.{key[1]}" for key in misplaced})
    for key in misplaced:
        del found[key]  # reported under "modules"; kept out of the shape checks
    present = {module for _, module, _ in found}
    layers = sorted({layer for layer, _, _ in found if layer != HEAD_LAYER})
    supported = ", ".join([*fp.modules, *HEAD_MODULES])
    checks = [
        listing("tensor_names", names.bad_names, f"names must look like {KEY_EXAMPLE}; bad: "),
        listing("lora_bias_tensors", names.bias, "LoRA bias tensors are not supported: "),
        listing(
            "modules",
            wrong_module,
            f"the base model ({fp.architecture}) has no such module; supported: {supported}; "
            "found: ",
            ok="adapts " + (", ".join(module_order(present, fp)) or "nothing"),
        ),
    ]
    checks = [c for c in checks if not c.passed or c.name in ("tensor_names", "modules")]
    checks.append(
        listing(
            "layers",
            [str(i) for i in layers if i >= fp.num_layers] + names.huge_layers,
            f"the base model has {fp.num_layers} layers (0-{fp.num_layers - 1}); found layer ",
            ok=f"adapts {len(layers)} of {fp.num_layers} layers",
        )
    )
    checks.append(_pairs_check(names))
    checks.append(_dora_check(names, bool(config.get("use_dora")), tensors))
    checks += _saved_checks(names, config, tensors, fp, max_saved_params)
    checks.append(_dtype_check(found, tensors))
    checks += _shape_checks(names, tensors, rules, fp, max_lora_rank)
    checks.append(_architecture_check(names, implied, config, fp))
    return checks, names


def _parent(names: ClassifiedNames, layer: int, module: str) -> str:
    return names.paths[(layer, module)].rsplit(".", 2)[-2]


def module_order(present: set[str], fp: ArchFingerprint) -> list[str]:
    return [m for m in (*fp.modules, *HEAD_MODULES) if m in present]


def _pairs_check(names: ClassifiedNames) -> Check:
    found = names.found
    unpaired = [
        f"{name} has no lora_{'B' if part == PART_A else 'A'}"
        for (layer, module, part), name in found.items()
        if part in (PART_A, PART_B)
        and (layer, module, PART_B if part == PART_A else PART_A) not in found
    ]
    return listing("pairs", unpaired, "every lora_A needs its lora_B: ")


def _dora_check(names: ClassifiedNames, use_dora: bool, tensors: dict[str, TensorInfo]) -> Check:
    """DoRA: one magnitude vector per LoRA pair, and only when use_dora says so."""
    found = names.found
    pairs = {(layer, module) for layer, module, part in found if part == PART_A}
    magnitudes = {
        (layer, module): n for (layer, module, part), n in found.items() if part == MAGNITUDE
    }
    problems = []
    if not use_dora and magnitudes:
        problems += [
            f"{n} is a DoRA magnitude but use_dora is not set" for n in magnitudes.values()
        ]
    missing = [names.paths[key] for key in sorted(pairs - set(magnitudes))] if use_dora else []
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        problems.append(
            "a DoRA adapter (use_dora) needs a lora_magnitude_vector per adapted module; none "
            f"for {', '.join(missing[:3])}{more}"
        )
    problems += [
        f"{n} has no LoRA factors to scale" for key, n in magnitudes.items() if key not in pairs
    ]
    problems += [
        f"{n} is {list(tensors[n].shape)}, a vector was expected"
        for n in magnitudes.values()
        if len(tensors[n].shape) != 1
    ]
    ok = f"DoRA on {len(magnitudes)} modules" if magnitudes else "no DoRA"
    return listing("dora", problems, "", ok=ok)


def _saved_checks(
    names: ClassifiedNames,
    config: dict[str, Any],
    tensors: dict[str, TensorInfo],
    fp: ArchFingerprint,
    max_params: int,
) -> list[Check]:
    """Whole modules: only embed_tokens / lm_head, and only up to max_params each."""
    listed = config.get("modules_to_save")
    listed = [listed] if isinstance(listed, str) else listed if isinstance(listed, list) else []
    problems = [
        f"modules_to_save lists {show(m)}; only embed_tokens and lm_head are served whole "
        "(train the others with LoRA)"
        for m in listed
        if not isinstance(m, str) or m.rsplit(".", 1)[-1] not in HEAD_MODULES
    ]
    if names.other_saved:
        shown = ", ".join(clip(p, 50) for p in names.other_saved[:2])
        more = f" and {len(names.other_saved) - 2} more" if len(names.other_saved) > 2 else ""
        problems.append(f"the file holds fully trained {shown}{more}")
    saved = {module: n for (_, module, part), n in names.found.items() if part == SAVED}
    problems += [
        f"modules_to_save names {m} but the file holds no copy of it"
        for m in sorted({m.rsplit(".", 1)[-1] for m in listed if isinstance(m, str)})
        if m in HEAD_MODULES and m not in saved
    ]
    warnings = []
    for (_, module, part), n in sorted(names.found.items()):
        if part not in (SAVED, BASE_COPY):
            continue
        shape = tensors[n].shape
        if shape != (fp.vocab, fp.hidden):
            problems.append(f"{n} is {list(shape)}, the base model's is {[fp.vocab, fp.hidden]}")
            continue
        params = fp.vocab * fp.hidden
        if params <= max_params:
            continue
        if part == SAVED:
            problems.append(
                f"the adapter's own {module} has {params:,} parameters, above this platform's "
                f"limit of {max_params:,} ({SAVED_MODULE_PARAMS_ENV}); only small heads are "
                "served whole"
            )
        else:
            warnings.append(
                f"{n} ({params:,} parameters) must equal the base model's {module}: a changed "
                f"copy above {max_params:,} parameters is refused when the engine loads it"
            )
    ok = f"serves its own {', '.join(sorted(saved))}" if saved else "no whole modules"
    checks = [listing("saved_modules", problems, "", ok=ok)]
    if warnings:
        checks.append(Check("base_layer_copies", False, "; ".join(warnings), level="warning"))
    return checks


def _dtype_check(found: FactorNames, tensors: dict[str, TensorInfo]) -> Check:
    factor_dtypes = sorted(
        {tensors[n].dtype for (_, _, p), n in found.items() if p in (PART_A, PART_B)}
    )
    all_dtypes = sorted({tensors[n].dtype for n in found.values()})
    if any(d not in FLOAT_DTYPES for d in all_dtypes):
        msg = (
            f"LoRA weights must be one of {', '.join(FLOAT_DTYPES)}; found {', '.join(all_dtypes)}"
        )
        return Check("dtype", False, msg)
    if len(factor_dtypes) > 1:
        return Check("dtype", False, f"LoRA weights mix dtypes {', '.join(factor_dtypes)}")
    return Check("dtype", True, (factor_dtypes or all_dtypes or ["no tensors"])[0])


def _expected_shapes(
    layer: int, module: str, rank: int, fp: ArchFingerprint
) -> dict[str, tuple[int, ...]]:
    if module == "embed_tokens":
        return {PART_A: (rank, fp.vocab), PART_B: (fp.hidden, rank), MAGNITUDE: (fp.hidden,)}
    if module == "lm_head":
        return {PART_A: (rank, fp.hidden), PART_B: (fp.vocab, rank), MAGNITUDE: (fp.vocab,)}
    fan_in, fan_out = fp.modules[module]
    return {PART_A: (rank, fan_in), PART_B: (fan_out, rank), MAGNITUDE: (fan_out,)}


def _shape_checks(
    names: ClassifiedNames,
    tensors: dict[str, TensorInfo],
    rules: ModuleRules,
    fp: ArchFingerprint,
    max_lora_rank: int,
) -> list[Check]:
    wrong_rank: list[str] = []
    wrong_shape: list[str] = []
    for (layer, module, part), name in sorted(names.found.items()):
        shape = tensors[name].shape
        if part in (SAVED, BASE_COPY):
            continue  # _saved_checks
        if part == MAGNITUDE:
            rank = 1
        elif len(shape) != 2:
            wrong_shape.append(f"{name} is {len(shape)}-D, not a matrix")
            continue
        else:
            rank = shape[0] if part == PART_A else shape[1]
            expected, key = rules.rank(names.paths[(layer, module)])
            if is_positive_int(expected) and rank != expected:
                why = (
                    f"r is {expected}" if key is None else f"rank_pattern {key!r} gives {expected}"
                )
                wrong_rank.append(f"{name} has rank {rank} but {why}")
            elif rank > max_lora_rank:
                wrong_rank.append(f"{name} has rank {rank}, above the maximum {max_lora_rank}")
        if layer < fp.num_layers:
            want = _expected_shapes(layer, module, rank, fp)[part]
            if shape != want and not (part == MAGNITUDE and len(shape) != 1):
                if part == MAGNITUDE:
                    wrong_shape.append(
                        f"{name} has {shape[0]} values; the module has {want[0]} outputs"
                    )
                else:
                    wrong_shape.append(
                        f"{name} is {list(shape)}, the base model needs {list(want)}"
                    )
    return [
        listing("tensor_rank", wrong_rank, ""),
        listing("shapes", wrong_shape, "shapes do not fit the base model: "),
    ]


@dataclass(frozen=True)
class _Implied:
    """What an adapter's LoRA factors say about the model they were trained on."""

    hidden: int | None  # the hidden size most factors are shaped for
    sizes: dict[str, tuple[int, int]]  # layer module -> (in, out) features of its factors


def _architecture_check(
    names: ClassifiedNames, implied: _Implied, config: dict[str, Any], fp: ArchFingerprint
) -> Check:
    """One plain sentence when the adapter was made for another model: the shapes it implies,
    the modules it names that the base lacks, and the base model it says it was trained on."""
    base = fp.architecture
    facts = []
    hidden = implied.hidden
    if hidden is not None and hidden != fp.hidden:
        facts.append(f"its shapes imply hidden size {hidden} (the base {base} has {fp.hidden})")
    else:  # same width, other projections: e.g. fewer KV heads
        other = [
            f"{m} maps {i} to {o} features where the base's maps {fp.modules[m][0]} to "
            f"{fp.modules[m][1]}"
            for m, (i, o) in implied.sizes.items()
            if m in fp.modules and (i, o) != fp.modules[m]
        ]
        if other:
            facts.append(f"its {', '.join(other[:3])}")
    named = {module for layer, module in names.paths if layer != HEAD_LAYER}
    foreign = sorted(named - set(fp.modules))
    if foreign and fp.fused:
        fused_into = {s: f for f, ss in FUSED_MODULES.items() for s in ss}
        facts.append(
            f"it names {', '.join(foreign)}, which {base} has fused into "
            + ", ".join(sorted({fused_into.get(m, m) for m in foreign}))
        )
    elif foreign:
        facts.append(f"it names {', '.join(foreign)}, which {base} lacks")
    mapping = config.get("auto_mapping")
    trained_class = mapping.get("base_model_class") if isinstance(mapping, dict) else None
    trained_family = family_of(trained_class)
    if trained_family is not None and fp.family is not None and trained_family != fp.family:
        facts.append(f"PEFT recorded its base as a {show(trained_class)}")
    if not facts:
        return Check("architecture", True, f"fits {base}")
    trained_on = config.get("base_model_name_or_path")
    if isinstance(trained_on, str) and trained_on.strip():
        facts.append(f"it says it was trained on {show(trained_on)}")
    return Check(
        "architecture",
        False,
        f"this adapter was made for another model than the base {base}: " + "; ".join(facts),
    )


def _implied_shapes(names: ClassifiedNames, tensors: dict[str, TensorInfo]) -> _Implied:
    hidden: Counter[int] = Counter()
    sizes: dict[str, tuple[int, int]] = {}
    for (layer, module, part), name in names.found.items():
        shape = tensors[name].shape
        if len(shape) != 2:
            continue
        if part == PART_A and module in (*_READS_HIDDEN, "lm_head"):
            hidden[shape[1]] += 1
        elif part == PART_B and module in ("o_proj", "down_proj", "embed_tokens"):
            hidden[shape[0]] += 1
        other = names.found.get((layer, module, PART_B if part == PART_A else PART_A))
        if layer != HEAD_LAYER and part == PART_A and other is not None:
            b_shape = tensors[other].shape
            if len(b_shape) == 2:
                sizes.setdefault(module, (shape[1], b_shape[0]))
    return _Implied(hidden.most_common(1)[0][0] if hidden else None, sizes)
