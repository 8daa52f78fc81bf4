"""Projections and the token embedding: the layers a LoRA adapter attaches to."""

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn


class LoRAHook(Protocol):
    """Adds each token's adapter change to a layer's output in place (see lora/apply.py)."""

    def apply(self, out: torch.Tensor, inputs: torch.Tensor, /) -> None: ...


class Linear(nn.Module):
    """y = x W^T (+ b), possibly several projections merged into one matmul.

    `output_sizes` lists the merged parts in order (q, k, v for `qkv_proj`; gate, up for
    `gate_up_proj`), so the loader can fill each part and a LoRA wrapper can add each
    part's own low-rank delta to its slice of the output. Every projection of the model
    is this class, so there is one place to extend: a LoRA target gets `lora` (a
    `lora.apply.LinearLoRA` in the layers, `HeadLoRA` on lm_head), which adds each token's
    adapter delta (and DoRA scale) when its batch has adapters.
    """

    def __init__(self, in_features: int, output_sizes: list[int], bias: bool = False):
        super().__init__()
        self.in_features = in_features
        self.output_sizes = list(output_sizes)
        self.out_features = sum(output_sizes)
        self.weight = nn.Parameter(torch.empty(self.out_features, in_features), requires_grad=False)
        self.bias = (
            nn.Parameter(torch.empty(self.out_features), requires_grad=False) if bias else None
        )
        self.lora: LoRAHook | None = None

    def output_slice(self, shard: int) -> slice:
        start = sum(self.output_sizes[:shard])
        return slice(start, start + self.output_sizes[shard])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight, self.bias)
        if self.lora is not None:
            self.lora.apply(out, x)
        return out


class VocabEmbedding(nn.Module):
    """The token embedding; with `lora` (a `lora.apply.EmbeddingLoRA`), adapters that change
    embed_tokens (LoRA, DoRA or their own copy) change their own tokens' rows."""

    def __init__(self, vocab_size: int, hidden_size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size), requires_grad=False)
        self.lora: LoRAHook | None = None

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        out = F.embedding(input_ids, self.weight)
        if self.lora is not None:
            self.lora.apply(out, input_ids)
        return out
