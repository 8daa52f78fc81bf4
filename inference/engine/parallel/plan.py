"""Which part of every weight a rank holds: heads, MLP columns and vocabulary rows.

q heads split evenly; KV heads split too when there are at least as many as ranks, else
each rank keeps the one KV head its query heads read (replicated across the ranks that
share it). The MLP splits its intermediate columns, the vocabulary its rows (the last
shard padded with zero rows when the vocabulary does not divide).
"""

import dataclasses
from dataclasses import dataclass

from ..errors import ConfigError
from ..model_config import ModelConfig
from ..quantization import QuantizationError, check_model_shapes


@dataclass(frozen=True)
class ShardPlan:
    rank: int
    size: int
    full: ModelConfig  # the whole model's shape

    @property
    def q_heads(self) -> int:
        return self.full.num_heads // self.size

    @property
    def kv_heads(self) -> int:
        return max(1, self.full.num_kv_heads // self.size)

    @property
    def intermediate(self) -> int:
        return self.full.intermediate_size // self.size

    @property
    def vocab_per_rank(self) -> int:
        return -(-self.full.vocab_size // self.size)

    def local_config(self) -> ModelConfig:
        """The shape one rank's modules are built with."""
        return dataclasses.replace(
            self.full,
            num_heads=self.q_heads,
            num_kv_heads=self.kv_heads,
            intermediate_size=self.intermediate,
        )

    def qkv_rows(self) -> list[slice]:
        """This rank's rows of q, k and v (each part's own row numbering)."""
        d = self.full.head_dim
        q = _block(self.rank, self.q_heads * d)
        kv_head = (
            self.rank * self.kv_heads
            if self.full.num_kv_heads >= self.size
            else self.rank // (self.size // self.full.num_kv_heads)
        )
        kv = slice(kv_head * d, (kv_head + self.kv_heads) * d)
        return [q, kv, kv]

    def gate_up_rows(self) -> list[slice]:
        part = _block(self.rank, self.intermediate)
        return [part, part]

    def o_columns(self) -> slice:
        return _block(self.rank, self.q_heads * self.full.head_dim)

    def down_columns(self) -> slice:
        return _block(self.rank, self.intermediate)

    def vocab_rows(self) -> slice:
        """This rank's vocabulary rows, clipped to the vocabulary (the padding has none)."""
        start = min(self.rank * self.vocab_per_rank, self.full.vocab_size)
        return slice(start, min(start + self.vocab_per_rank, self.full.vocab_size))


def check_shardable(mc: ModelConfig, size: int) -> None:
    """Refuse a tensor-parallel size the model's heads or MLP cannot be split by."""
    reasons = []
    if mc.num_heads % size:
        reasons.append(f"its {mc.num_heads} attention heads")
    kv = mc.num_kv_heads
    if kv % size and size % kv:
        reasons.append(f"its {kv} KV heads (neither a multiple nor a divisor of {size})")
    if mc.intermediate_size % size:
        reasons.append(f"its MLP width {mc.intermediate_size}")
    if reasons:
        raise ConfigError(
            f"tensor_parallel_size {size} does not divide {' and '.join(reasons)}; "
            f"choose a size that does (LORAPLEX_TENSOR_PARALLEL_SIZE)"
        )
    if mc.quantization is not None:  # groups and packed ints must not straddle two ranks
        try:
            check_model_shapes(mc.quantization, mc.fingerprint, size)
        except QuantizationError as e:
            raise ConfigError(
                f"tensor_parallel_size {size}: {e}; choose a size that splits it "
                "(LORAPLEX_TENSOR_PARALLEL_SIZE)"
            ) from None


def _block(rank: int, width: int) -> slice:
    return slice(rank * width, (rank + 1) * width)
