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
def linear_scale(
    weight: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    scale: float,
    magnitude: torch.Tensor,
) -> torch.Tensor:
    """g [out] = m / ||W + s B A|| per row; weight [out, in] on its device, A [r, in],
    B [out, r], m [out]. Computed in float32 on the weight's device."""
    device = weight.device
    a = lora_a.to(device, torch.float32)
    b = lora_b.to(device, torch.float32)
    step = max(1, _CHUNK_ELEMENTS // max(weight.shape[1], 1))
    norms = [
        torch.linalg.norm(weight[i : i + step].float() + scale * (b[i : i + step] @ a), dim=1)
        for i in range(0, weight.shape[0], step)
    ]
    return magnitude.to(device, torch.float32) / torch.cat(norms)


@torch.inference_mode()
def embedding_scale(
    weight: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    scale: float,
    magnitude: torch.Tensor,
) -> torch.Tensor:
    """g [hidden] = m / ||W + s A^T B^T|| per hidden column over the vocabulary; weight
    [vocab, hidden], A [r, vocab] and B [hidden, r] as PEFT stores them, m [hidden]."""
    device = weight.device
    a_t = lora_a.to(device, torch.float32).T
    b_t = lora_b.to(device, torch.float32).T
    step = max(1, _CHUNK_ELEMENTS // max(weight.shape[1], 1))
    squares = torch.zeros(weight.shape[1], dtype=torch.float32, device=device)
    for i in range(0, weight.shape[0], step):
        rows = weight[i : i + step].float() + scale * (a_t[i : i + step] @ b_t)
        squares += rows.square().sum(dim=0)
    return magnitude.to(device, torch.float32) / squares.sqrt()
