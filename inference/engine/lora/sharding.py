"""LoRA under tensor parallelism: each adapter's factors cut the way their layer's weight
is (model/parallel_layers.py), and the extras no rank could apply exactly refused.

DoRA scales each output row by m / ||W + s B A|| over the whole input: a row-parallel
layer's rank holds only some columns of that row, and its scaled partial sums would need
the norm before the all-reduce that forms them. LoRA on embed_tokens / lm_head and saved
heads are refused with it, so one rule covers every extra: they would need their own
vocabulary sharding. Plain LoRA on every layer target is served.
"""

from collections.abc import Callable, Iterable
from functools import partial

import torch

from ..model.layers import Linear
from .peft_rules import AdapterError, AdapterTensors

FactorSharder = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def sharders(
    targets: Iterable[tuple[int, str, Linear, list[str]]],
) -> dict[tuple[int, str], FactorSharder]:
    """(layer, module) -> its factors' sharder, for the targets of a sharded model (none
    for a whole one)."""
    out: dict[tuple[int, str], FactorSharder] = {}
    for layer, _, linear, modules in targets:
        shard = getattr(linear, "shard_factors", None)
        if shard is not None:
            for part, module in enumerate(modules):
                out[(layer, module)] = partial(shard, part=part)
    return out


def refuse_extras_when_sharded(tensors: AdapterTensors) -> None:
    kinds = []
    if tensors.magnitudes:
        kinds.append("DoRA")
    if tensors.heads:
        kinds.append(f"LoRA on {' and '.join(sorted(tensors.heads))}")
    if tensors.saved or tensors.base_copies:
        kinds.append("saved embed_tokens / lm_head modules")
    if kinds:
        raise AdapterError(
            f"it uses {', '.join(kinds)}, which a tensor-parallel engine does not serve "
            f"(DoRA needs each output row's norm over the whole weight, which no rank holds; "
            f"the heads would need their own vocabulary sharding); serve it on an engine "
            f"with LORAPLEX_TENSOR_PARALLEL_SIZE=1"
        )
