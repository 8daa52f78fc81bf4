"""RMSNorm, computed in float32, in Llama's form (w * x̂) or Gemma's ((1 + w) * x̂)."""

import torch
from torch import nn


class RMSNorm(nn.Module):
    """Given a residual, adds it first and returns the sum as the next residual, saving one
    pass over the activations per norm. `offset` 1 is Gemma's norm, whose stored weight is
    the scale minus one; it also scales in float32 before casting, as transformers does."""

    def __init__(self, hidden_size: int, eps: float, offset: float = 0.0):
        super().__init__()
        self.eps, self.offset = eps, offset
        self.weight = nn.Parameter(torch.empty(hidden_size), requires_grad=False)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is not None:
            x = x + residual
            residual = x
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.offset:
            out = (h * (self.offset + self.weight.float())).to(x.dtype)
        else:
            out = self.weight * h.to(x.dtype)
        return out if residual is None else (out, residual)

    def norm(self, x: torch.Tensor) -> torch.Tensor:
        """Without a residual (typed for callers that pass none)."""
        out = self(x)
        assert isinstance(out, torch.Tensor)
        return out
