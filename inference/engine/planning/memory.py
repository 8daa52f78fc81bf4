"""What a GPU holds besides the KV cache and the adapter slots, estimated as the engine
measures it at start-up: its resident weights (counted from the engine's own model built on
the meta device), a step's peak activations, the decode graphs' pool and the runtime's own
memory.

The engine sizes its cache after a warm-up prefill of `max_num_batched_tokens` tokens, in
sequences of `max_model_len`; its peak is every token's layer peak plus each sequence's
logits. The CUDA context, cuBLAS workspaces, NCCL's buffers under tensor parallelism and the
caching allocator's slack are no tensors: RUNTIME_RESERVE_BYTES stands for them (about what
a Hopper context with NCCL takes; the engine sees them as memory already in use).
"""

import math

import torch

from ..cuda_graphs import SAMPLE_BYTES_PER_LOGIT, graph_pool_estimate, peak_row_bytes
from ..model.decoder import CausalLM
from ..model.quantized_linear import stored_bytes, weight_bytes
from ..model_config import ModelConfig
from ..parallel.plan import ShardPlan
from ..utils import default_dtype

RUNTIME_RESERVE_BYTES = 1 << 30
LOGIT_BYTES = 4  # the step's logits in float32


def meta_model(mc: ModelConfig, dtype: torch.dtype, tp: int, max_model_len: int) -> CausalLM:
    """Rank 0's model as the engine builds it, without memory: its shapes, quantized
    linears and shards are the engine's own."""
    plan = ShardPlan(0, tp, mc) if tp > 1 else None
    with torch.device("meta"), default_dtype(dtype):
        return CausalLM(mc, max_positions=max_model_len, plan=plan)


def resident_weight_bytes(model: CausalLM) -> int:
    """What the engine's stats report as weights_bytes once this model is loaded."""
    return weight_bytes(model, quantized=stored_bytes)[0]


def step_activation_bytes(
    local: ModelConfig, itemsize: int, batch_tokens: int, max_model_len: int
) -> int:
    """The warm-up step's peak beyond resident memory, on one rank (`local` its shape)."""
    layer, head = peak_row_bytes(local, itemsize)
    rows = math.ceil(batch_tokens / max_model_len)
    logits = max(head + LOGIT_BYTES * local.vocab_size, SAMPLE_BYTES_PER_LOGIT * local.vocab_size)
    return batch_tokens * layer + rows * logits


def graph_reserve_bytes(
    mc: ModelConfig, dtype: torch.dtype, max_num_seqs: int, max_model_len: int, block_size: int
) -> int:
    """What the engine keeps free for its decode graphs (captured for batches up to
    min(max_num_seqs, 256), the default capture size)."""
    largest = min(max_num_seqs, 256)
    return graph_pool_estimate(mc, dtype, largest, -(-max_model_len // block_size)).total
