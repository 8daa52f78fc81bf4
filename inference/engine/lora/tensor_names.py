"""What each tensor of a PEFT adapter file is, from its name alone.

PEFT saves, under `base_model.model.`:
- a layer linear's LoRA: `model.layers.{i}.self_attn.q_proj.lora_A.weight` ([r, in]),
  `.lora_B.weight` ([out, r]) and, for DoRA, `.lora_magnitude_vector` ([out]);
- LoRA on the embedding: `model.embed_tokens.lora_embedding_A` ([r, vocab]),
  `.lora_embedding_B` ([hidden, r]); on the head: `lm_head.lora_A.weight` ([r, hidden]),
  `.lora_B.weight` ([vocab, r]);
- a module trained whole (`modules_to_save`): `lm_head.weight`, `model.embed_tokens.weight`;
- with LoRA on an embedding layer, a copy of the base layer: `....base_layer.weight`.
Names are split here into (layer, module, part); whether they fit the base model is
peft_rules' business.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

HEAD_LAYER = -1  # the "layer" of embed_tokens and lm_head, which sit outside the layers
# parts of a module an adapter may hold
A, B, MAGNITUDE, SAVED, BASE_COPY = "A", "B", "magnitude", "saved", "base_copy"
PREFIX = "base_model.model."
HEAD_PATHS = {"model.embed_tokens": "embed_tokens", "lm_head": "lm_head"}
MAX_LAYER_DIGITS = 6

_MAGNITUDE = {"lora_magnitude_vector": MAGNITUDE, "lora_magnitude_vector.weight": MAGNITUDE}
_LINEAR_PARTS = {"lora_A.weight": A, "lora_B.weight": B} | _MAGNITUDE
_WHOLE = {"weight": SAVED, "base_layer.weight": BASE_COPY}
_HEAD_PARTS = {
    "embed_tokens": {"lora_embedding_A": A, "lora_embedding_B": B} | _MAGNITUDE | _WHOLE,
    "lm_head": _LINEAR_PARTS | _WHOLE,
}
_BIAS = ("lora_A.bias", "lora_B.bias")
_SUFFIXES = sorted(
    {*_LINEAR_PARTS, *_HEAD_PARTS["embed_tokens"], *_HEAD_PARTS["lm_head"], *_BIAS},
    key=len,
    reverse=True,
)
_LAYER_PATH = re.compile(r"(?:model\.)?layers\.(0|[1-9][0-9]*)\.([^.]+)\.([^.]+)")

# (layer, module, part) -> the tensor's name in the file
FactorNames = dict[tuple[int, str, str], str]
ModuleKey = tuple[int, str]  # (layer, module); layer HEAD_LAYER for embed_tokens / lm_head


@dataclass
class ClassifiedNames:
    found: FactorNames = field(default_factory=dict)
    paths: dict[ModuleKey, str] = field(default_factory=dict)  # module path, as PEFT names it
    bad_names: list[str] = field(default_factory=list)
    bias: list[str] = field(default_factory=list)
    other_saved: list[str] = field(default_factory=list)  # whole modules we do not serve
    huge_layers: list[str] = field(default_factory=list)

    def modules(self) -> set[ModuleKey]:
        return {(layer, module) for layer, module, _ in self.found}


def classify(names: list[str]) -> ClassifiedNames:
    """Sort every tensor name into a (layer, module, part) or a kind of problem."""
    out = ClassifiedNames()
    for name in sorted(names):
        suffix = next((s for s in _SUFFIXES if name.endswith("." + s)), None)
        if not name.startswith(PREFIX) or suffix is None:
            out.bad_names.append(name)
            continue
        path = name[len(PREFIX) : -len(suffix) - 1]
        if "lora_" in path:  # e.g. lora_A.default.weight: PEFT strips the adapter name
            out.bad_names.append(name)
        elif suffix in _BIAS:
            out.bias.append(name)
        elif path in HEAD_PATHS:
            module = HEAD_PATHS[path]
            part = _HEAD_PARTS[module].get(suffix)
            if part is None:
                out.bad_names.append(name)
            else:
                out.found[(HEAD_LAYER, module, part)] = name
                out.paths[(HEAD_LAYER, module)] = path
        elif (m := _LAYER_PATH.fullmatch(path)) is not None and suffix in _LINEAR_PARTS:
            if len(m[1]) > MAX_LAYER_DIGITS:  # beyond any model: never converted to an int
                out.huge_layers.append(f"{m[1][:12]}… ({len(m[1])} digits)")
                continue
            key = (int(m[1]), m[3])
            if out.paths.setdefault(key, path) != path:  # one module under two parents
                out.bad_names.append(name)
                continue
            out.found[(*key, _LINEAR_PARTS[suffix])] = name
        elif suffix in _WHOLE:
            out.other_saved.append(path)
        else:
            out.bad_names.append(name)
    return out
