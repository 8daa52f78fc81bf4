"""Input checks shared by both backends, so a bad call fails the same way on CPU and GPU.

Kernels index memory with the shapes they are given: a wrong shape there reads another
slot's weights or writes past a row instead of raising. Every check here reads only shapes,
dtypes and host-side batch fields, so it never synchronises with the device.
"""

import torch

from inference.kernels.lora_batch import LoRABatch

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check_tensor(name: str, t: object, dim: int, batch: LoRABatch) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {tuple(t.shape)}")
    if t.device != batch.device:
        raise ValueError(f"{name} is on {t.device} but the LoRA batch is on {batch.device}")
    if t.dtype not in DTYPES:
        raise ValueError(f"{name} has dtype {t.dtype}; supported: fp32, bf16, fp16")
    return t


def _check_stack(name: str, stack: object, batch: LoRABatch) -> list[torch.Tensor]:
    """Stacked per-slot weights: a non-empty list of [S, d1, d2], one per output slice."""
    if not isinstance(stack, list | tuple) or not stack:
        raise ValueError(
            f"{name} must be a non-empty list of stacked [S, ., .] tensors, one per slice"
        )
    weights = [_check_tensor(f"{name}[{i}]", w, 3, batch) for i, w in enumerate(stack)]
    first = weights[0]
    for i, w in enumerate(weights):
        if w.dtype != first.dtype:
            raise ValueError(f"{name}[{i}] has dtype {w.dtype} but {name}[0] has {first.dtype}")
        if w.shape[0] != first.shape[0]:
            raise ValueError(
                f"{name}[{i}] has {w.shape[0]} slots but {name}[0] has {first.shape[0]}; "
                "every slice must be stacked over the same max_loras slots"
            )
    if batch.max_slot >= first.shape[0]:
        raise ValueError(
            f"token slot {batch.max_slot} is out of range: {name} holds {first.shape[0]} slots "
            f"(valid slots are 0..{first.shape[0] - 1}, or -1 for no adapter)"
        )
    return weights


def _check_buffer(name: str, buffer: object, n_slices: int, rank: int, batch: LoRABatch) -> None:
    y = _check_tensor(name, buffer, 3, batch)
    want = (n_slices, batch.num_tokens, rank)
    if tuple(y.shape) != want:
        raise ValueError(
            f"{name} must be [n_slices, num_tokens, rank] = {list(want)}, got {list(y.shape)}"
            + (
                f"; its rank {y.shape[2]} differs from the stacked rank {rank}"
                if y.shape[2] != rank
                else ""
            )
        )


def _check_shrink_inputs(inputs: object, stack: object, batch: LoRABatch) -> list[torch.Tensor]:
    x = _check_tensor("x", inputs, 2, batch)
    lora_a = _check_stack("lora_a", stack, batch)
    rank = lora_a[0].shape[1]
    if x.shape[0] != batch.num_tokens:
        raise ValueError(f"x has {x.shape[0]} tokens but the LoRA batch has {batch.num_tokens}")
    for i, a in enumerate(lora_a):
        if a.shape[1] != rank:
            raise ValueError(f"lora_a[{i}] has rank {a.shape[1]} but lora_a[0] has rank {rank}")
        if a.shape[2] != x.shape[1]:
            raise ValueError(
                f"lora_a[{i}] expects {a.shape[2]} input features but x has {x.shape[1]}"
            )
    if lora_a[0].dtype != x.dtype:
        raise ValueError(f"lora_a has dtype {lora_a[0].dtype} but x has {x.dtype}; cast one")
    return lora_a


def _check_expand_inputs(
    stack: object, scale_values: object, batch: LoRABatch, output: object
) -> list[torch.Tensor]:
    lora_b = _check_stack("lora_b", stack, batch)
    num_slots, rank = lora_b[0].shape[0], lora_b[0].shape[2]
    for i, b in enumerate(lora_b):
        if b.shape[2] != rank:
            raise ValueError(f"lora_b[{i}] has rank {b.shape[2]} but lora_b[0] has rank {rank}")
    out = _check_tensor("out", output, 2, batch)
    width = sum(b.shape[1] for b in lora_b)
    if tuple(out.shape) != (batch.num_tokens, width):
        raise ValueError(
            f"out must be [num_tokens, sum of slice widths] = {[batch.num_tokens, width]}, "
            f"got {list(out.shape)}"
        )
    if lora_b[0].dtype != out.dtype:
        raise ValueError(f"lora_b has dtype {lora_b[0].dtype} but out has {out.dtype}; cast one")
    scales = _check_tensor("scales", scale_values, 1, batch)
    if scales.shape[0] != num_slots:
        raise ValueError(f"scales has {scales.shape[0]} entries but lora_b holds {num_slots} slots")
    return lora_b


def check_shrink(x: object, lora_a: object, batch: LoRABatch, out: object) -> None:
    a_stack = _check_shrink_inputs(x, lora_a, batch)
    _check_buffer("out", out, len(a_stack), a_stack[0].shape[1], batch)


def check_expand(y: object, lora_b: object, scales: object, batch: LoRABatch, out: object) -> None:
    b_stack = _check_expand_inputs(lora_b, scales, batch, out)
    _check_buffer("y", y, len(b_stack), b_stack[0].shape[2], batch)


def check_add_lora(
    out: object, x: object, lora_a: object, lora_b: object, scales: object, batch: LoRABatch
) -> None:
    """Both halves, and the pair must agree: one A per B, same rank, same slots."""
    a_stack = _check_shrink_inputs(x, lora_a, batch)
    b_stack = _check_expand_inputs(lora_b, scales, batch, out)
    if len(a_stack) != len(b_stack):
        raise ValueError(f"got {len(a_stack)} lora_a slices but {len(b_stack)} lora_b slices")
    a, b = a_stack[0], b_stack[0]
    if a.shape[1] != b.shape[2]:
        raise ValueError(f"lora_a has rank {a.shape[1]} but lora_b has rank {b.shape[2]}")
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"lora_a holds {a.shape[0]} slots but lora_b holds {b.shape[0]}")


def check_scratch(buffer: object, n_slices: int, rank: int, batch: LoRABatch) -> None:
    """add_lora's reusable y: fp32 (partial sums meet there), at least as big as this batch."""
    t = batch.num_tokens
    if (
        not isinstance(buffer, torch.Tensor)
        or buffer.dim() != 3
        or buffer.shape[0] < n_slices
        or buffer.shape[1] < t
        or buffer.shape[2] != rank
        or buffer.dtype != torch.float32
        or buffer.device != batch.device
    ):
        got = (
            f"{list(buffer.shape)} {buffer.dtype} on {buffer.device}"
            if isinstance(buffer, torch.Tensor)
            else type(buffer).__name__
        )
        raise ValueError(
            f"buffer must be fp32 scratch of at least [{n_slices}, {t}, {rank}] (slices, tokens, "
            f"rank) on {batch.device}, got {got}"
        )
