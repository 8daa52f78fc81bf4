"""Sizing and allocating the paged KV cache, once, at start-up.

The number of pages is fixed here from a byte budget, so admission and preemption later
only count free blocks and never meet an out-of-memory error mid-step. The cache is
block-major: page p holds block p of every layer, keys and values, contiguous, so the LoRA
slots can lend and borrow whole pages of it (memory_pool.py) and moving a block is one copy.
"""

import torch

from .config import EngineConfig
from .errors import ConfigError

CPU_DEFAULT_KV_BYTES = 512 << 20


def kv_cache_budget(
    config: EngineConfig,
    device: torch.device,
    lora_bytes: int = 0,
    graph_bytes: int = 0,
    slot_bytes: int = 0,
) -> int:
    """Bytes of the pool (KV pages and the adapter slots' pages). With `kv_cache_bytes`
    set, that budget less what LoRA keeps outside the pool (`lora_bytes`: scales, scratch,
    the extras arena; the decode graphs come on top). Unset on CPU, `default_kv_bytes` of
    cache plus `slot_bytes` (the pages of max_loras slots, or CPU_DEFAULT_SLOTS'), so the
    defaults start whatever the slots cost. Unset on CUDA, the share `gpu_memory_utilization` of
    device memory minus what weights, LoRA (already allocated), a warm-up step and the
    decode graphs captured after the cache (`graph_bytes`, estimated) use."""
    if config.kv_cache_bytes is None and device.type != "cuda":
        return default_kv_bytes(config) + slot_bytes
    if config.kv_cache_bytes is not None:
        total = config.kv_cache_bytes
        budget = total - lora_bytes
        if budget < config.kv_block_bytes:
            raise ConfigError(
                f"the memory budget of {total} bytes (kv_cache_bytes) holds the scales, "
                f"scratch and extras of the LoRA slots ({lora_bytes} bytes) but no KV block "
                f"of {config.kv_block_bytes} bytes; raise kv_cache_bytes (or leave it unset to "
                f"size it from the model) or lower max_loras / max_lora_rank"
            )
        return budget
    free, total = torch.cuda.mem_get_info(device)
    # Peak activations beyond resident memory, measured by the warm-up the runner ran before.
    activations = torch.cuda.max_memory_allocated(device) - torch.cuda.memory_allocated(device)
    return device_kv_budget(config, total, total - free, activations, graph_bytes)


def device_kv_budget(
    config: EngineConfig, total: int, used: int, activations: int, graph_bytes: int
) -> int:
    """The share `gpu_memory_utilization` of a device's `total` bytes left for the KV cache
    once what is `used`, a step's peak `activations` and the decode graphs' pool are
    counted."""
    budget = memory_pool_bytes(total, config.gpu_memory_utilization, used, activations, graph_bytes)
    if budget < config.kv_block_bytes:
        graphs = f", {graph_bytes / 2**30:.2f} GiB kept for CUDA graphs" if graph_bytes else ""
        raise ConfigError(
            f"no device memory left for the KV cache ({used / 2**30:.1f} GiB of "
            f"{total / 2**30:.1f} GiB in use{graphs}); raise gpu_memory_utilization or lower "
            f"max_num_batched_tokens" + (" or max_cudagraph_capture_size" if graph_bytes else "")
        )
    return budget


def memory_pool_bytes(
    total: int, utilization: float, used: int, activations: int, graph_bytes: int
) -> int:
    """What the share `utilization` of a device's `total` bytes leaves for the KV cache and
    the LoRA slots once resident memory, a step's peak activations and the decode graphs'
    pool are counted (the capacity planner sizes with the same arithmetic)."""
    return int(total * utilization) - used - activations - graph_bytes


def allocate_kv_cache(
    model: torch.nn.Module, config: EngineConfig, num_pages: int, device: torch.device
) -> torch.Tensor:
    """The pool, [num_pages, 2, layers, block_size, kv_heads, head_dim]: page p is block p of
    every layer. Each layer's Attention gets its keys and values as views of shape
    [num_pages, block_size, kv_heads, head_dim], strided over the pages, and on the CPU the
    whole pool as [-1, kv_heads * head_dim] rows to store through (attention.store_kv_rows):
    a page's rows are every layer's keys, then every layer's values, block_size each."""
    from .model.attention import Attention

    mc = config.model_config
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    cache = torch.zeros(
        num_pages,
        2,
        len(layers),
        config.block_size,
        mc.num_kv_heads,
        mc.head_dim,
        dtype=config.torch_dtype,
        device=device,
    )
    rows = cache.view(-1, mc.num_kv_heads * mc.head_dim) if device.type == "cpu" else None
    for i, layer in enumerate(layers):
        layer.k_cache, layer.v_cache = cache[:, 0, i], cache[:, 1, i]
        layer.kv_rows = rows
        layer.rows_per_page = 2 * len(layers) * config.block_size
        layer.key_rows_offset = i * config.block_size
    return cache


def slot_rows(pool: torch.Tensor, num_slots: int, pages_per_slot: int, numel: int) -> torch.Tensor:
    """The adapter slots' weights as a view of the pool's bottom pages: [num_slots, numel],
    slot s starting at page s * pages_per_slot (memory_pool.py)."""
    page_numel = pool[0].numel()
    flat = pool.view(-1)[: num_slots * pages_per_slot * page_numel]
    return flat.view(num_slots, pages_per_slot * page_numel)[:, :numel]


def default_kv_bytes(config: EngineConfig) -> int:
    """The CPU default: 512 MiB of cache, and never less than one sequence of
    `max_model_len` tokens (else the longest request the model takes could not run)."""
    assert config.max_model_len is not None  # resolved by EngineConfig
    return cpu_default_kv_bytes(config.max_model_len, config.block_size, config.kv_block_bytes)


def cpu_default_kv_bytes(max_model_len: int, block_size: int, kv_block_bytes: int) -> int:
    blocks = -(-max_model_len // block_size)
    return max(CPU_DEFAULT_KV_BYTES, blocks * kv_block_bytes)
