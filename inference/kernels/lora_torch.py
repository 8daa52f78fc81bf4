"""Torch reference of the multi-LoRA ops; the CPU backend and the kernels' test oracle.

Two strategies, the same arithmetic (inputs upcast to fp32, each output element rounded
once, as the Triton kernels do):
- per segment: one matmul pair per active slot over its tokens; no wasted rows.
- padded: every segment zero-padded to the longest, all slots in one bmm; a fixed number
  of ops, where a loop pays per-op overhead per adapter for a few tokens each.
Measured on this 2-core CPU with SmolLM2 shapes (hidden 576, kv 192, ffn 1536, rank 16,
1-256 tokens, 1-8 adapters): gathering each token's own A/B for a bmm lost everywhere from 8
tokens up, 2-30x (it copies R*in weights per token), and one product against all slots' A
stacked as [S*R, in] lost 1.2-3x to the loop (S times the work, B copied per call). The loop
against padding, add_lora on one layer's qkv, gate_up and down: with 4-8 adapters sharing
8-256 tokens evenly, padding was 1.1-2.4x faster (one case, 256 tokens over 4, 0.8x); with
one adapter they are the same code. Padding wastes work when one long prefill shares the
batch with short decodes, so it is used only while the padded rows stay within twice the
real ones (or a small floor, PADDED_MIN_ROWS).
"""

import torch

from inference.kernels.lora_batch import LoRABatch

PADDED_MIN_ROWS = 64


def _use_padding(batch: LoRABatch) -> bool:
    padded, real = batch.num_segments * batch.max_seg_len, batch.padded_rows.numel()
    return batch.num_segments > 1 and padded <= max(PADDED_MIN_ROWS, 2 * real)


def _write_rows(
    cols: torch.Tensor, rows: torch.Tensor | None, delta: torch.Tensor, add: bool
) -> None:
    """cols[rows] (+)= delta, with delta in fp32 and one rounding to cols' dtype."""
    if rows is None:
        cols.copy_(cols.float() + delta if add else delta)
    elif add and cols.dtype == torch.float32:
        cols.index_add_(0, rows, delta)
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
        g, m, rows = batch.num_segments, batch.max_seg_len, batch.sorted_token_ids
        xp = x.new_zeros((g * m, x.shape[1]), dtype=torch.float32)
        xp.index_copy_(0, batch.padded_rows, x.index_select(0, rows).float())
        # All slices share x: one product against their A's stacked along the rank.
        a = torch.cat([w.index_select(0, batch.seg_slots) for w in lora_a], dim=1).float()
        yp = torch.bmm(xp.view(g, m, -1), a.transpose(1, 2)).view(g * m, n, rank)
        ys = yp.index_select(0, batch.padded_rows).transpose(0, 1)
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
    """out[t, cols_i] (+)= scales[slot] * y[i, t] @ lora_b[i][slot]^T; rows without an adapter untouched."""
    widths = [b.shape[1] for b in lora_b]
    if _use_padding(batch):
        g, m, rows = batch.num_segments, batch.max_seg_len, batch.sorted_token_ids
        n, rank = y.shape[0], y.shape[2]
        yp = y.new_zeros((n, g * m, rank), dtype=torch.float32)
        yp.index_copy_(1, batch.padded_rows, y.index_select(1, rows).float())
        yp = yp.view(n, g, m, rank) * scales.index_select(0, batch.seg_slots).float().view(
            1, g, 1, 1
        )
        for i, (b, cols) in enumerate(zip(lora_b, out.split(widths, dim=1), strict=True)):
            bs = b.index_select(0, batch.seg_slots).float()
            delta = torch.bmm(yp[i], bs.transpose(1, 2)).view(g * m, -1)
            _write_rows(cols, rows, delta.index_select(0, batch.padded_rows), add)
        return
    for slot, start, length in batch.segments:
        rows = (
            None if length == batch.num_tokens else batch.sorted_token_ids[start : start + length]
        )
        ys = (y if rows is None else y.index_select(1, rows)).float() * scales[slot].float()
        for i, (b, cols) in enumerate(zip(lora_b, out.split(widths, dim=1), strict=True)):
            _write_rows(cols, rows, ys[i] @ b[slot].float().T, add)
