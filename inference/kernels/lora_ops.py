"""The multi-LoRA ops the engine calls: check the inputs, then run the batch's backend.

For each target linear, per token t with adapter slot s (s = -1: no adapter):
    out[t] += scales[s] * (x[t] @ A[s]^T) @ B[s]^T
A merged linear (q/k/v, gate/up) passes one A/B pair per output slice; slice i writes the
columns [offset_i, offset_i + width_i) of `out`, offsets following the list order.
"""

from collections.abc import Iterable
from types import ModuleType

import torch

from inference.kernels import lora_torch
from inference.kernels.lora_batch import LoRABatch
from inference.kernels.lora_checks import check_add_lora, check_expand, check_scratch, check_shrink


def _impl(batch: LoRABatch) -> ModuleType:
    if batch.backend == "triton":
        # Imported here only: defining @triton.jit kernels must never happen on a CPU engine.
        from inference.kernels import lora_triton

        return lora_triton
    return lora_torch


def check_tiles(
    stacks: Iterable[tuple[list[torch.Tensor], list[torch.Tensor]]], max_tokens: int, backend: str
) -> None:
    """Once at start-up, for the (A, B) stacks of every target linear: ValueError naming the
    tile-table entry a launch of the kernels could not run on the stacks' device (see
    lora_triton.check_tiles), so a bad table fails the start and never a request."""
    if backend != "triton":
        return
    from inference.kernels import lora_triton

    hiddens: dict[str, set[int]] = {"shrink": set(), "expand": set()}
    device, itemsize, rank = None, 2, 0
    for lora_a, lora_b in stacks:
        hiddens["shrink"].add(lora_a[0].shape[2])
        hiddens["expand"].add(max(b.shape[1] for b in lora_b))
        device, itemsize, rank = lora_a[0].device, lora_a[0].element_size(), lora_a[0].shape[1]
    if device is not None:
        lora_triton.check_tiles(device, itemsize, rank, hiddens, max_tokens)


def lora_shrink(
    x: torch.Tensor, lora_a: list[torch.Tensor], batch: LoRABatch, out: torch.Tensor
) -> None:
    """out[i, t, :] = x[t] @ lora_a[i][slot[t]]^T. x [T, in], lora_a[i] [S, R, in], out [n, T, R].

    Rows of tokens without an adapter are left as they were (their content must not matter).
    """
    check_shrink(x, lora_a, batch, out)
    if batch.num_segments:
        _impl(batch).lora_shrink(x, lora_a, batch, out)


def lora_expand(
    y: torch.Tensor,
    lora_b: list[torch.Tensor],
    scales: torch.Tensor,
    batch: LoRABatch,
    out: torch.Tensor,
    add: bool = True,
) -> None:
    """out[t, cols_i] (+)= scales[slot[t]] * y[i, t] @ lora_b[i][slot[t]]^T.

    y [n, T, R], lora_b[i] [S, width_i, R], scales [S], out [T, sum(width_i)]. `add=False`
    overwrites instead of adding. Rows of tokens without an adapter are never written.
    """
    check_expand(y, lora_b, scales, batch, out)
    if batch.num_segments:
        _impl(batch).lora_expand(y, lora_b, scales, batch, out, add)


def add_lora(
    out: torch.Tensor,
    x: torch.Tensor,
    lora_a: list[torch.Tensor],
    lora_b: list[torch.Tensor],
    scales: torch.Tensor,
    batch: LoRABatch,
    buffer: torch.Tensor | None = None,
    *,
    check: bool = True,
) -> None:
    """Shrink then expand into `out`: the one call the engine makes per target linear.

    `buffer` is optional fp32 scratch of at least [n_slices, T, R]; the engine can allocate
    one for its largest batch and reuse it in every layer instead of allocating per call.

    `check=False` skips the input checks, for a caller that checked its stacks once and
    builds every batch itself: the engine makes this call for every target linear of every
    step, where the checks would cost more than the LoRA work of a small batch on a CPU.
    Wrong shapes then read or write the wrong memory instead of raising.
    """
    if check:
        check_add_lora(out, x, lora_a, lora_b, scales, batch)
        if buffer is not None:
            check_scratch(buffer, len(lora_a), lora_a[0].shape[1], batch)
    if not batch.num_segments:
        return
    n, rank, t = len(lora_a), lora_a[0].shape[1], batch.num_tokens
    if buffer is None:
        y = torch.empty((n, t, rank), dtype=torch.float32, device=x.device)
    else:
        y = buffer[:n, :t]
    if batch.backend == "torch":  # may keep the products padded between the halves
        lora_torch.add_lora(out, x, lora_a, lora_b, scales, batch, y)
    else:
        impl = _impl(batch)
        impl.lora_shrink(x, lora_a, batch, y)
        impl.lora_expand(y, lora_b, scales, batch, out, True)
