"""The tensor-parallel layers, cut by parallel/plan.py. Each keeps the plain layer's forward
and LoRA hook, so the LoRA slots see a layer of this rank's shape and its factors are sharded
the way its weight is:

- ColumnParallelLinear (q/k/v, gate/up): output rows split, no communication; LoRA's A
  whole, B split by the same rows.
- RowParallelLinear (o, down): input columns split; the partial product plus LoRA's partial
  delta (A split by the same columns, B whole) is summed by the layer's one all-reduce,
  and the bias is added on rank 0 only, so it is counted once.
- VocabParallelEmbedding: each rank looks up its own rows, zeros elsewhere, one all-reduce.
- ParallelLMHead: each rank's logits for its rows, gathered.

`take_shard` turns a checkpoint tensor into this rank's part for the loader.
"""

import torch
import torch.nn.functional as F

from ..parallel.group import all_gather_last, all_reduce
from .layers import Linear, VocabEmbedding


class ColumnParallelLinear(Linear):
    def __init__(
        self,
        in_features: int,
        full_sizes: list[int],
        rows: list[slice],
        bias: bool = False,
    ):
        super().__init__(in_features, [r.stop - r.start for r in rows], bias)
        self.full_sizes, self.rows = list(full_sizes), rows

    def take_shard(self, tensor: torch.Tensor, part: int | None) -> torch.Tensor:
        if part is not None:
            return tensor[self.rows[part]]
        if tensor.shape[0] != sum(self.full_sizes):
            return tensor  # the loader reports the shape mismatch
        parts = tensor.split(self.full_sizes, dim=0)
        return torch.cat([p[rows] for p, rows in zip(parts, self.rows, strict=True)])

    def shard_factors(
        self, a: torch.Tensor, b: torch.Tensor, part: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return a, b[self.rows[part]]


class RowParallelLinear(Linear):
    def __init__(self, columns: slice, out_features: int, bias: bool, rank: int):
        super().__init__(columns.stop - columns.start, [out_features], bias)
        self.columns, self.first_rank = columns, rank == 0

    def take_shard(self, tensor: torch.Tensor, part: int | None) -> torch.Tensor:
        return tensor[:, self.columns] if tensor.dim() == 2 else tensor

    def shard_factors(
        self, a: torch.Tensor, b: torch.Tensor, part: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return a[:, self.columns], b

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight, self.bias if self.first_rank else None)
        if self.lora is not None:
            self.lora.apply(out, x)
        return all_reduce(out)


class VocabParallelEmbedding(VocabEmbedding):
    def __init__(self, rows: slice, per_rank: int, hidden_size: int):
        super().__init__(per_rank, hidden_size)
        self.rows = rows

    def take_shard(self, tensor: torch.Tensor, part: int | None) -> torch.Tensor:
        return _padded_rows(tensor, self.rows, self.weight.shape[0])

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.rows.start
        outside = (local < 0) | (local >= self.rows.stop - self.rows.start)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out = all_reduce(out.masked_fill_(outside[:, None], 0))
        if self.lora is not None:
            self.lora.apply(out, input_ids)
        return out


class ParallelLMHead(Linear):
    def __init__(self, hidden_size: int, rows: slice, per_rank: int, vocab_size: int):
        super().__init__(hidden_size, [per_rank])
        self.rows, self.vocab_size = rows, vocab_size

    def take_shard(self, tensor: torch.Tensor, part: int | None) -> torch.Tensor:
        return _padded_rows(tensor, self.rows, self.out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight)
        if self.lora is not None:
            self.lora.apply(out, x)
        return all_gather_last(out)[:, : self.vocab_size]


def _padded_rows(tensor: torch.Tensor, rows: slice, length: int) -> torch.Tensor:
    if tensor.dim() != 2:
        return tensor
    part = tensor[rows]
    if part.shape[0] == length:
        return part
    return torch.cat([part, part.new_zeros(length - part.shape[0], *part.shape[1:])])
