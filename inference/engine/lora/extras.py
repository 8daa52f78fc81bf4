"""What some adapters carry beyond their slot row, laid out as one host tensor.

A slot row holds every adapter's per-layer LoRA factors at one size. DoRA scales, LoRA on
embed_tokens / lm_head and whole saved heads exist only for the adapters that use them, so
they travel separately: one flat tensor per adapter (pinned on CUDA, so a swap-in is still
one copy) with a layout of named pieces, copied into the device arena (arena.py) while the
adapter has a slot.

Pieces, by (kind, layer, module) with layer HEAD_LAYER for the heads:
- ("dora", layer, linear) [out]: g = m / ||W + s B A|| over a merged linear's full output
  (1 where the adapter leaves a slice alone); ("dora_bias", layer, linear) [out]:
  (1 - g) * b for a linear with a bias, since DoRA scales W x + s B A x but not b.
- ("lora_a" / "lora_b", HEAD_LAYER, head): embed_tokens keeps A transposed [vocab, r] so
  a token's row is one lookup, and B [hidden, r]; lm_head keeps A [r, hidden], B [vocab, r].
- ("dora", HEAD_LAYER, head): g [hidden] for embed_tokens, [vocab] for lm_head.
- ("saved", HEAD_LAYER, head) [vocab, hidden]: the adapter's own copy of the module.
"""

from dataclasses import dataclass, field

import torch

from . import dora
from .peft_rules import HEAD_LAYER, SAVED_MODULE_PARAMS_ENV, AdapterError, AdapterTensors

ExtraKey = tuple[str, int, str]
DORA, DORA_BIAS, LORA_A, LORA_B, SAVED = "dora", "dora_bias", "lora_a", "lora_b", "saved"
HEADS = ("embed_tokens", "lm_head")
_EQUAL_CHUNK_ROWS = 4096


@dataclass
class BaseLinear:
    weight: torch.Tensor  # [out, in], on the device
    bias: torch.Tensor | None
    slices: dict[str, slice]  # engine module (q_proj, ...) -> its rows of the output


@dataclass
class BaseView:
    """The served model's weights that DoRA scales and saved-copy checks are computed
    against (the same tensors the forward pass uses; with tied embeddings the two heads
    are one tensor)."""

    linears: dict[tuple[int, str], BaseLinear]  # (layer, merged linear name)
    linear_of: dict[tuple[int, str], tuple[int, str]]  # (layer, module) -> its linear
    heads: dict[str, torch.Tensor]  # embed_tokens / lm_head weight [vocab, hidden]

    @property
    def tied(self) -> bool:
        return self.heads["embed_tokens"] is self.heads["lm_head"]


@dataclass
class HostExtras:
    flat: torch.Tensor  # every piece back to back, in the serving dtype
    layout: dict[ExtraKey, tuple[int, tuple[int, ...]]]  # key -> (offset, shape)
    head_scales: dict[str, float] = field(default_factory=dict)  # LoRA scale of each head

    @property
    def numel(self) -> int:
        return self.flat.numel()

    @property
    def nbytes(self) -> int:
        return self.flat.numel() * self.flat.element_size()


def build_extras(
    tensors: AdapterTensors,
    base: BaseView,
    dtype: torch.dtype,
    pin: bool,
    max_saved_params: int,
) -> HostExtras | None:
    """An adapter's extras (None when it has none), DoRA scales computed against `base`."""
    pieces: dict[ExtraKey, torch.Tensor] = {}
    for (layer, module), magnitude in tensors.magnitudes.items():
        if layer != HEAD_LAYER:
            _linear_dora(pieces, layer, module, magnitude, tensors, base)
    head_scales = {}
    own = _own_weights(tensors, base, max_saved_params)
    for head in HEADS:
        weight = own.get(head)
        if weight is not None:
            pieces[(SAVED, HEAD_LAYER, head)] = weight
        if head not in tensors.heads:
            continue
        a, b = tensors.heads[head]
        scale = head_scales[head] = tensors.scales[(HEAD_LAYER, head)]
        pieces[(LORA_A, HEAD_LAYER, head)] = a.T if head == "embed_tokens" else a
        pieces[(LORA_B, HEAD_LAYER, head)] = b
        head_magnitude = tensors.magnitudes.get((HEAD_LAYER, head))
        if head_magnitude is not None:
            w = base.heads[head] if weight is None else weight
            pieces[(DORA, HEAD_LAYER, head)] = dora.magnitude_scale(
                w, a, b, scale, head_magnitude, embedding=head == "embed_tokens"
            )
    if not pieces:
        return None
    return _flatten(pieces, dtype, pin, head_scales)


def _linear_dora(
    pieces: dict[ExtraKey, torch.Tensor],
    layer: int,
    module: str,
    magnitude: torch.Tensor,
    tensors: AdapterTensors,
    base: BaseView,
) -> None:
    name = base.linear_of[(layer, module)]
    linear = base.linears[name]
    rows = linear.slices[module]
    a, b = tensors.factors[(layer, module)]
    g = dora.magnitude_scale(linear.weight[rows], a, b, tensors.scales[(layer, module)], magnitude)
    out = linear.weight.shape[0]
    full = pieces.setdefault((DORA, *name), torch.ones(out, device=g.device))
    full[rows] = g
    if linear.bias is not None:
        shift = pieces.setdefault((DORA_BIAS, *name), torch.zeros(out, device=g.device))
        shift[rows] = (1 - g) * linear.bias[rows].float()


def _own_weights(
    tensors: AdapterTensors, base: BaseView, max_saved_params: int
) -> dict[str, torch.Tensor]:
    """The heads the adapter brings its own weight for: a modules_to_save copy, or a
    base_layer copy (PEFT saves one next to LoRA on an embedding layer) that differs from
    the served weight. PEFT loads such a copy into the model, so it is what the adapter was
    trained with; with tied embeddings that changes both heads, unless the other has a copy
    of its own."""
    own = dict(tensors.saved)
    changed = {}
    for head, copy in tensors.base_copies.items():
        if head not in own and not _equal(copy, base.heads[head]):
            if copy.numel() > max_saved_params:
                raise AdapterError(
                    f"adapter refused: its copy of the base model's {head} differs from the "
                    f"served weights, and a copy of {copy.numel():,} parameters is above this "
                    f"platform's limit of {max_saved_params:,} ({SAVED_MODULE_PARAMS_ENV}); save "
                    "the adapter with save_embedding_layers=False if the base was not changed"
                )
            changed[head] = copy
    own |= changed
    if base.tied:
        for head, other in zip(HEADS, reversed(HEADS), strict=True):
            if head not in own and head not in tensors.base_copies and other in changed:
                own[head] = changed[other]
    return own


def _equal(copy: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether a host copy equals a (device) weight in the serving dtype, a few rows at a time."""
    for i in range(0, weight.shape[0], _EQUAL_CHUNK_ROWS):
        part = copy[i : i + _EQUAL_CHUNK_ROWS].to(weight.device, weight.dtype)
        if not torch.equal(part, weight[i : i + _EQUAL_CHUNK_ROWS]):
            return False
    return True


def _flatten(
    pieces: dict[ExtraKey, torch.Tensor], dtype: torch.dtype, pin: bool, scales: dict[str, float]
) -> HostExtras:
    embed_key, head_key = (SAVED, HEAD_LAYER, "embed_tokens"), (SAVED, HEAD_LAYER, "lm_head")
    shared = (
        embed_key in pieces
        and head_key in pieces
        and torch.equal(pieces[embed_key], pieces[head_key])
    )  # a tied model's two saved copies (ensure_weight_tying) are stored once
    layout: dict[ExtraKey, tuple[int, tuple[int, ...]]] = {}
    numel = 0
    for key, t in pieces.items():
        if shared and key == head_key:
            continue
        layout[key] = (numel, tuple(t.shape))
        numel += t.numel()
    if shared:
        layout[head_key] = layout[embed_key]
    flat = torch.empty(numel, dtype=dtype, pin_memory=pin)
    for key, (offset, shape) in layout.items():
        n = pieces[key].numel()
        flat[offset : offset + n].view(shape).copy_(pieces[key])
    return HostExtras(flat, layout, scales)


def extras_views(
    data: torch.Tensor, start: int, extras: HostExtras
) -> dict[ExtraKey, torch.Tensor]:
    """Each piece as a view of `data` (the arena) where the flat copy starts at `start`."""
    views = {}
    for key, (offset, shape) in extras.layout.items():
        n = 1
        for d in shape:
            n *= d
        views[key] = data[start + offset : start + offset + n].view(shape)
    return views
