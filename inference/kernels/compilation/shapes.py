"""The sizes that decide which kernel variants an engine launches: one rank's share of the
model's heads and MLP, the dtype, the LoRA rank and the step sizes (tokens per step, decode
batch sizes with and without CUDA graphs). The engine reads them from its configuration
(inference/engine/kernel_warmup.py); `deployments` lists the models the engine serves at
their deployment shapes, for the compile check.
"""

from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True)
class EngineShapes:
    name: str
    dtype: torch.dtype
    hidden: int
    intermediate: int  # this rank's MLP width
    num_heads: int  # this rank's query heads
    num_kv_heads: int  # this rank's KV heads
    head_dim: int
    windows: tuple[int | None, ...]  # the distinct sliding windows of the layers (None: full)
    softcap: float | None
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int = 16
    graph_sizes: tuple[int, ...] = ()  # decode batch sizes of the CUDA graphs; () eager
    lora_rank: int = 0  # max_lora_rank; 0 without LoRA
    max_loras: int = 4
    deterministic: bool = False  # the engine's deterministic_kernels: no shrink splits K
    quant_schemes: tuple[str, ...] = ()  # quantized-base schemes (variants.quant_launches)
    # the dtype a compressed-tensors checkpoint stores its scales in; None: `dtype`
    quant_scale_dtype: torch.dtype | None = None
    tensor_parallel: int = 1  # ranks: row-parallel FP8 layers then run weight-only

    @property
    def max_blocks(self) -> int:
        return -(-self.max_model_len // self.block_size)

    @property
    def lora_tokens(self) -> int:
        """Tokens of the LoRA scratch (LoRASlots.buffer): the most a step feeds."""
        return max(self.max_num_batched_tokens, self.max_num_seqs)


def _model(name: str, hidden: int, intermediate: int, heads: int, kv_heads: int,
           head_dim: int, windows: tuple[int | None, ...] = (None,),
           softcap: float | None = None, max_model_len: int = 8192) -> EngineShapes:  # fmt: skip
    return EngineShapes(
        name=name, dtype=torch.bfloat16, hidden=hidden, intermediate=intermediate,
        num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, windows=windows,
        softcap=softcap, max_model_len=max_model_len, max_num_seqs=256,
        max_num_batched_tokens=8192, graph_sizes=(), lora_rank=64, max_loras=8,
    )  # fmt: skip


# Whole models, before tensor parallelism (config.json's sizes)
MODELS = (
    _model("llama-3-8b", 4096, 14336, 32, 8, 128),
    _model("llama-3-70b", 8192, 28672, 64, 8, 128),
    _model("qwen2.5-7b", 3584, 18944, 28, 4, 128),
    _model("mistral-7b-v0.1", 4096, 14336, 32, 8, 128, windows=(4096,)),
    _model("gemma-2-9b", 3584, 14336, 16, 8, 256, windows=(None, 4096), softcap=50.0),
    _model("gemma-2-27b", 4608, 36864, 32, 16, 128, windows=(None, 4096), softcap=50.0),
    _model("phi-3-mini", 3072, 8192, 32, 32, 96, windows=(2047,), max_model_len=4096),
    _model("head-dim-80", 2560, 10240, 32, 32, 80),  # Phi-2's attention shape
)
TENSOR_PARALLEL = (1, 2, 4, 8)
LORA_RANKS = (8, 16, 32, 64)


def sharded(model: EngineShapes, size: int) -> EngineShapes | None:
    """One rank's shapes under tensor parallelism (as parallel/plan.py cuts them), or None
    when `size` does not divide the model. Decode runs eagerly then (no CUDA graphs)."""
    kv = model.num_kv_heads
    if model.num_heads % size or model.intermediate % size or (kv % size and size % kv):
        return None
    graphs = () if size > 1 else tuple(_capture_sizes(min(model.max_num_seqs, 256)))
    return replace(
        model,
        name=f"{model.name}/tp{size}",
        num_heads=model.num_heads // size,
        num_kv_heads=max(1, kv // size),
        intermediate=model.intermediate // size,
        graph_sizes=graphs,
        tensor_parallel=size,
    )


def _capture_sizes(largest: int) -> list[int]:
    # the engine's CUDA-graph batch sizes (cuda_graphs.capture_sizes), without importing it
    return [s for s in (1, 2, 4) if s < largest] + list(range(8, largest, 8)) + [largest]


def deployments(
    dtypes: tuple[torch.dtype, ...] = (torch.bfloat16,),
    models: tuple[EngineShapes, ...] = MODELS,
    sizes: tuple[int, ...] = TENSOR_PARALLEL,
    ranks: tuple[int, ...] = LORA_RANKS,
) -> list[EngineShapes]:
    """Every model at every tensor-parallel size that divides it, in each dtype, served
    with each max_lora_rank (the LoRA stacks are padded to it)."""
    out = []
    for model in models:
        for size in sizes:
            shard = sharded(model, size)
            if shard is None:
                continue
            for dtype in dtypes:
                for rank in ranks:
                    name = f"{shard.name}/{_dtype(dtype)}/r{rank}"
                    out.append(replace(shard, dtype=dtype, lora_rank=rank, name=name))
    return out


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
