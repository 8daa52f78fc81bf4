"""DoRA's per-output scale, computed once when an adapter loads.

PEFT's DoraLinearLayer computes `m / ||W + s * B @ A||` (the L2 norm of each output row of
the adapted weight, over the in-features) and outputs `g * (W x + s * B A x) + b`. The
norm depends only on weights, so the engine computes `g` here against the base weight it
serves and then applies one multiply per adapted output at run time. For an embedding,
PEFT's DoraEmbeddingLayer takes the norm of each hidden column over the vocabulary.
"""

import torch

_CHUNK_ELEMENTS = 1 << 24  # rows of W + s*B@A formed at once, to bound the temporary


@torch.inference_mode()
def magnitude_scale(
    weight: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    scale: float,
    magnitude: torch.Tensor,
    *,
    embedding: bool = False,
) -> torch.Tensor:
    """g = m / ||W + s delta||, in float32 on the weight's device. A linear (weight [out, in],
    A [r, in], B [out, r], m [out]) has one per output row; an embedding (weight [vocab,
    hidden], A [r, vocab] and B [hidden, r] as PEFT stores them, m [hidden]) one per hidden
    column, over the vocabulary."""
    device = weight.device
    a = lora_a.to(device, torch.float32)
    b = lora_b.to(device, torch.float32)
    step = max(1, _CHUNK_ELEMENTS // max(weight.shape[1], 1))
    norms = (
        _column_norms(weight, a, b, scale, step)
        if embedding
        else _row_norms(weight, a, b, scale, step)
    )
    return magnitude.to(device, torch.float32) / norms


def _row_norms(
    weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float, step: int
) -> torch.Tensor:
    """||W + s B A|| of each row, `step` rows at a time."""
    norms = [
        torch.linalg.norm(weight[i : i + step].float() + scale * (b[i : i + step] @ a), dim=1)
        for i in range(0, weight.shape[0], step)
    ]
    return torch.cat(norms)


def _column_norms(
    weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float, step: int
) -> torch.Tensor:
    """||W + s A^T B^T|| of each column, summed over `step` rows at a time."""
    a_t, b_t = a.T, b.T
    squares = torch.zeros(weight.shape[1], dtype=torch.float32, device=weight.device)
    for i in range(0, weight.shape[0], step):
        rows = weight[i : i + step].float() + scale * (a_t[i : i + step] @ b_t)
        squares += rows.square().sum(dim=0)
    return squares.sqrt()
