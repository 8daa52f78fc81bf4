"""How adapters change a forward pass: each token gets its own adapter's delta.

- Layer linears (`LinearLoRA`): out += scale[slot] * (x A[slot]^T) B[slot]^T per token, with
  the multi-LoRA kernels over the stacked slots; then, for the tokens of DoRA adapters,
  out = g * out + (1 - g) * b (DoRA scales W x + s B A x, not the bias).
- embed_tokens (`EmbeddingLoRA`) and lm_head (`HeadLoRA`): only some adapters change them,
  so they hold per-slot pieces (extras.py) and go over the batch's tokens per adapter: the
  adapter's own copy of the module replaces the base one, then its LoRA delta (A looked up
  per token for the embedding), then its DoRA scale.
lm_head runs on the rows being sampled only, so it reads its own rows from the
ForwardContext (`lora_head`), while the other layers read every fed token (`lora`).
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from inference.kernels import add_lora

from ..model.context import SlotRows, get_forward_context


@dataclass
class HeadAdapter:
    """One adapter's change to embed_tokens or lm_head, as views of the device arena."""

    saved: torch.Tensor | None  # its own weight [vocab, hidden], replacing the base one
    lora_a: torch.Tensor | None  # embed_tokens: A^T [vocab, r]; lm_head: A [r, hidden]
    lora_b: torch.Tensor | None  # embed_tokens: B [hidden, r]; lm_head: B [vocab, r]
    scale: float
    dora: torch.Tensor | None  # g: [hidden] for embed_tokens, [vocab] for lm_head


class LinearLoRA:
    """One target linear's stacks: out += scale[slot] * (x A[slot]^T) B[slot]^T per token.

    The stacks' shapes, dtypes and device were checked once at start-up (`LoRASlots`), and
    the per-step batch only ever names slots the manager filled, so `apply` skips the
    kernels' input checks instead of repeating them 120 times per step."""

    def __init__(
        self, lora_a: list[torch.Tensor], lora_b: list[torch.Tensor], scales: torch.Tensor
    ):
        self.lora_a, self.lora_b, self.scales = lora_a, lora_b, scales
        # slot -> DoRA (g [out], (1 - g) * bias [out] or None) of the adapter there
        self.dora: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}

    def apply(self, out: torch.Tensor, x: torch.Tensor) -> None:
        step = get_forward_context().lora
        if step is None:  # no adapter in this batch: no LoRA work at all
            return
        add_lora(
            out, x, self.lora_a, self.lora_b, self.scales, step.batch, step.buffer, check=False
        )
        if not self.dora:
            return
        for slot, rows in step.extra_rows:
            scales = self.dora.get(slot)
            if scales is not None:
                g, shift = scales
                y = out if rows is None else out.index_select(0, rows)
                y = y * g if shift is None else torch.addcmul(shift, y, g)
                write_rows(out, rows, y)


class EmbeddingLoRA:
    """embed_tokens' per-adapter changes, for the tokens of the adapters that have them."""

    def __init__(self) -> None:
        self.adapters: dict[int, HeadAdapter] = {}  # slot -> its adapter's change

    def apply(self, out: torch.Tensor, input_ids: torch.Tensor) -> None:
        step = get_forward_context().lora
        if step is None or not self.adapters:
            return
        _adapt_rows(out, input_ids, step.extra_rows, self.adapters, F.embedding)


class HeadLoRA:
    """lm_head's per-adapter changes, on the rows whose logits this step computes."""

    def __init__(self) -> None:
        self.adapters: dict[int, HeadAdapter] = {}

    def apply(self, out: torch.Tensor, x: torch.Tensor) -> None:
        head_rows = get_forward_context().lora_head
        if not head_rows:
            return
        _adapt_rows(out, x, head_rows, self.adapters, F.linear)


def _adapt_rows(
    out: torch.Tensor,
    inputs: torch.Tensor,
    rows_by_slot: SlotRows,
    adapters: dict[int, HeadAdapter],
    project: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> None:
    """embed_tokens' or lm_head's change (`project` is the module's op on a weight) to the
    rows of each slot whose adapter has one."""
    for slot, rows in rows_by_slot:
        a = adapters.get(slot)
        if a is None:
            continue
        xs = inputs if rows is None else inputs.index_select(0, rows)
        if a.saved is not None:
            y = project(xs, a.saved)
        else:
            y = out if rows is None else out.index_select(0, rows)
        if a.lora_a is not None and a.lora_b is not None:
            y = y + F.linear(project(xs, a.lora_a), a.lora_b) * a.scale
        if a.dora is not None:
            y = y * a.dora
        write_rows(out, rows, y)


def slot_rows(token_slots: list[int], wanted: set[int], device: torch.device) -> SlotRows:
    """The rows of each slot in `wanted` that the batch uses (see SlotRows)."""
    present = wanted.intersection(token_slots)
    rows: SlotRows = []
    for slot in sorted(present):
        idx = [i for i, s in enumerate(token_slots) if s == slot]
        whole = len(idx) == len(token_slots)
        rows.append((slot, None if whole else torch.tensor(idx, dtype=torch.long, device=device)))
    return rows


def write_rows(out: torch.Tensor, rows: torch.Tensor | None, y: torch.Tensor) -> None:
    if rows is None:
        out.copy_(y)
    else:
        out.index_copy_(0, rows, y.to(out.dtype))
