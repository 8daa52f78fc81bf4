"""Torch reference of the multi-LoRA ops; the CPU backend and the kernels' test oracle.

Two strategies, the same arithmetic (inputs upcast to fp32, each output element rounded
once, as the Triton kernels do):
- per segment: one matmul pair per active slot over its tokens; no wasted rows.
- padded: every segment zero-padded to the longest, all slots in one bmm; a fixed number
  of ops, where a loop pays per-op overhead per adapter for a few tokens each.
Padding wins when several adapters share a batch evenly (with one adapter the two are the
same code) and wastes work when one long prefill shares the batch with short decodes, so it
is used only while the padded rows stay within twice the real ones (or a floor,
PADDED_MIN_ROWS, below which padded rows cost less than ops). A batch that pads badly as a
whole (Zipf traffic: one adapter with many tokens, many with one, or a prefill beside
decodes) runs as a few groups of segments of similar length, each padded on its own
(`LoRABatch.padding_groups`), rather than one product pair per segment. Two other layouts
lost to both on a CPU and are gone: a bmm over each token's own gathered A/B (it copies
R*in weights per token), and one product against all slots' A stacked as [S*R, in] (S
times the work, B copied per call).

`add_lora` runs both halves in one pass: with padding, the low-rank products stay in the
padded layout between shrink and expand instead of going back to token order and out again,
a round trip that cost much of the engine's LoRA time per decode step.

Padded groups are either the active segments, with their slots' weights gathered (copied)
for the bmm, or every slot from the batch's lowest to its highest, read in place, inactive
slots' rows left zero. Gathering copies the active adapters' weights each call, read,
written and read again: in the engine as much time as the base model's own matmuls. Reading
the stacks in place reads each slot of the span once, so it wins once a third of them are
active (FULL_STACK_MIN_SHARE); it needs fp32 stacks (an upcast would copy them all). The
slot allocator fills the lowest free slots first, so the adapters of a batch tend to sit
close together even when the pool holds many slots.
"""

import torch

from inference.kernels.lora_batch import LoRABatch, pads_within

FULL_STACK_MIN_SHARE = 1 / 3
CAT_MAX_ELEMENTS = 1 << 16  # add_lora joins the slices' deltas up to this size, then writes once


def _use_padding(batch: LoRABatch) -> bool:
    return batch.pads_well()


def _padding_groups(batch: LoRABatch) -> tuple[LoRABatch, ...]:
    return batch.padding_groups


def _full_stack(batch: LoRABatch, weights: list[torch.Tensor]) -> bool:
    """Whether the padded groups are the slots from the batch's lowest to its highest, the
    stacks read in place there (see above). The padding rule applies to those slots' rows
    too, so long prefills keep the gathered path."""
    return (
        weights[0].dtype == torch.float32
        and batch.num_segments >= FULL_STACK_MIN_SHARE * batch.slot_span
        and pads_within(batch.slot_span * batch.max_seg_len, batch.padded_rows.numel())
    )


def _in_place(batch: LoRABatch, stack: torch.Tensor) -> torch.Tensor:
    """The slots a full-stack product reads: lowest to highest of the batch's, a view."""
    return stack[batch.min_slot : batch.max_slot + 1]


def _padded_rows(batch: LoRABatch, full: bool) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(tokens, rows): tokens with an adapter (None: all of them, in order) and each one's row
    in the padded [groups * max_seg_len] layout, group = its segment or, with the full stack,
    its slot's place in the span read. With every token active the tokens need no gather or
    scatter of their own."""
    if batch.padded_rows.numel() == batch.num_tokens:
        return None, batch.token_slot_rows if full else batch.token_padded_rows
    return batch.sorted_token_ids, batch.slot_rows if full else batch.padded_rows


def _padded_layout(
    batch: LoRABatch, weights: list[torch.Tensor]
) -> tuple[bool, int, torch.Tensor | None, torch.Tensor]:
    """(full stack?, number of groups, tokens, rows) of the padded layout (see _padded_rows)."""
    full = _full_stack(batch, weights)
    groups = batch.slot_span if full else batch.num_segments
    return full, groups, *_padded_rows(batch, full)


def _pad_tokens(
    x: torch.Tensor, rows: torch.Tensor | None, padded: torch.Tensor, groups: int, m: int
) -> torch.Tensor:
    """x's tokens with an adapter, padded: [groups, m, in] in fp32, zeros in the padding."""
    xp = x.new_zeros((groups * m, x.shape[1]), dtype=torch.float32)
    xp.index_copy_(0, padded, (x if rows is None else x.index_select(0, rows)).float())
    return xp.view(groups, m, -1)


def _write_rows(
    cols: torch.Tensor, rows: torch.Tensor | None, delta: torch.Tensor, add: bool
) -> None:
    """cols[rows] (+)= delta, with delta in fp32 and one rounding to cols' dtype. A gather,
    an add and a row copy: index_add_ on a CPU tensor dispatches once per row, which made it
    one of the costliest ops of a decode step."""
    if rows is None:
        if add and cols.dtype == torch.float32:
            cols.add_(delta)
        else:
            cols.copy_(cols.float() + delta if add else delta)
    else:
        if add:
            delta = delta + cols.index_select(0, rows).float()
        cols.index_copy_(0, rows, delta.to(cols.dtype))


def lora_shrink(
    x: torch.Tensor, lora_a: list[torch.Tensor], batch: LoRABatch, out: torch.Tensor
) -> None:
    """out[i, t] = x[t] @ lora_a[i][slot[t]]^T for tokens with an adapter; other rows untouched."""
    n, rank = len(lora_a), lora_a[0].shape[1]
    if _use_padding(batch):
        full, g, rows, padded = _padded_layout(batch, lora_a)
        m = batch.max_seg_len
        xp = _pad_tokens(x, rows, padded, g, m)
        if full:  # one bmm per slice against the stack itself
            yp = torch.stack(
                [
                    torch.bmm(xp, _in_place(batch, w).transpose(1, 2)).view(g * m, rank)
                    for w in lora_a
                ]
            )
            ys = yp.index_select(1, padded)
        else:  # all slices share x: one product against their A's stacked along the rank
            a = torch.cat([w.index_select(0, batch.seg_slots) for w in lora_a], dim=1).float()
            yp = torch.bmm(xp, a.transpose(1, 2)).view(g * m, n, rank)
            ys = yp.index_select(0, padded).transpose(0, 1)
        if rows is None:
            out.copy_(ys)
        else:
            out.index_copy_(1, rows, ys.to(out.dtype))
        return
    for slot, start, length in batch.segments:
        rows = (
            None if length == batch.num_tokens else batch.sorted_token_ids[start : start + length]
        )
        xs = (x if rows is None else x.index_select(0, rows)).float()
        a = torch.cat([w[slot] for w in lora_a]).float()
        ys = (xs @ a.T).view(length, n, rank).transpose(0, 1).to(out.dtype)
        if rows is None:
            out.copy_(ys)
        else:
            out.index_copy_(1, rows, ys)


def lora_expand(
    y: torch.Tensor,
    lora_b: list[torch.Tensor],
    scales: torch.Tensor,
    batch: LoRABatch,
    out: torch.Tensor,
    add: bool = True,
) -> None:
    """out[t, cols_i] (+)= scales[slot] * y[i, t] @ lora_b[i][slot]^T; rows without an
    adapter untouched."""
    widths = [b.shape[1] for b in lora_b]
    if _use_padding(batch):
        full, g, rows, padded = _padded_layout(batch, lora_b)
        m = batch.max_seg_len
        n, rank = y.shape[0], y.shape[2]
        yp = y.new_zeros((n, g * m, rank), dtype=torch.float32)
        yp.index_copy_(1, padded, (y if rows is None else y.index_select(1, rows)).float())
        group_scales = (
            _in_place(batch, scales) if full else scales.index_select(0, batch.seg_slots)
        ).float()
        yp = yp.view(n, g, m, rank) * group_scales.view(1, g, 1, 1)
        deltas = []
        for i, b in enumerate(lora_b):
            bs = _in_place(batch, b) if full else b.index_select(0, batch.seg_slots).float()
            deltas.append(torch.bmm(yp[i], bs.transpose(1, 2)).view(g * m, -1))
        # one write of all slices into `out` (a row scatter into a column slice is slow)
        delta = deltas[0] if n == 1 else torch.cat(deltas, dim=1)
        _write_rows(out, rows, delta.index_select(0, padded), add)
        return
    for slot, start, length in batch.segments:
        rows = (
            None if length == batch.num_tokens else batch.sorted_token_ids[start : start + length]
        )
        ys = (y if rows is None else y.index_select(1, rows)).float() * scales[slot].float()
        for i, (b, cols) in enumerate(zip(lora_b, out.split(widths, dim=1), strict=True)):
            _write_rows(cols, rows, ys[i] @ b[slot].float().T, add)


def add_lora(
    out: torch.Tensor,
    x: torch.Tensor,
    lora_a: list[torch.Tensor],
    lora_b: list[torch.Tensor],
    scales: torch.Tensor,
    batch: LoRABatch,
    y: torch.Tensor,
) -> None:
    """out[t, cols_i] += scales[slot] * (x[t] @ A_i[slot]^T) @ B_i[slot]^T. With padding,
    the products stay padded between the halves (fp32, as in `y`); otherwise it is
    lora_shrink into the scratch `y`, then lora_expand."""
    if not _use_padding(batch):
        groups = _padding_groups(batch)
        if len(groups) > 1:  # segments of very different lengths: each group padded apart
            for group in groups:
                add_lora(out, x, lora_a, lora_b, scales, group, y)
            return
        lora_shrink(x, lora_a, batch, y)
        lora_expand(y, lora_b, scales, batch, out, True)
        return
    full, g, rows, padded = _padded_layout(batch, lora_a)
    m = batch.max_seg_len
    xp = _pad_tokens(x, rows, padded, g, m)
    group_scales = (
        _in_place(batch, scales) if full else scales.index_select(0, batch.seg_slots)
    ).float()
    group_scales = group_scales.view(g, 1, 1)
    deltas = []
    for a, b in zip(lora_a, lora_b, strict=True):
        if full:
            a, b = _in_place(batch, a), _in_place(batch, b)
        else:
            a = a.index_select(0, batch.seg_slots).float()
            b = b.index_select(0, batch.seg_slots).float()
        products = torch.bmm(xp, a.transpose(1, 2)) * group_scales
        deltas.append(torch.bmm(products, b.transpose(1, 2)).view(g * m, -1))
    if len(deltas) == 1 or g * m * out.shape[1] > CAT_MAX_ELEMENTS:
        # big (prefill) deltas: write each slice into its columns rather than copy them
        # into one tensor first
        for delta, cols in zip(deltas, out.split([d.shape[1] for d in deltas], dim=1), strict=True):
            _write_rows(cols, rows, delta.index_select(0, padded), True)
    else:  # small (decode) deltas: one write instead of one per slice
        _write_rows(out, rows, torch.cat(deltas, dim=1).index_select(0, padded), True)
