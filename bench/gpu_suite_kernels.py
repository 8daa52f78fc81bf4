"""The suite's kernel checks: Triton paged attention (decode and extend) against the torch
reference over a shuffled paged cache, and the multi-LoRA kernels against theirs (through
bench/gpu_lora.py's layer, every kernel path). On CUDA the decode kernel is timed too."""

from dataclasses import dataclass
from typing import Any

import torch
from gpu_lora import LLAMA3_8B as LORA_8B
from gpu_lora import TINY as LORA_TINY
from gpu_lora import Layer, bench_case, graphed, layer_linears, timer


@dataclass(frozen=True)
class AttentionShape:
    heads: int
    kv_heads: int
    head_dim: int
    block_size: int
    context_lens: tuple[int, ...]  # one sequence each; not all multiples of the block size
    chunk: int  # new tokens per sequence in the extend check, over a cached prefix

    @property
    def max_blocks(self) -> int:
        return -(-max(self.context_lens) // self.block_size)


ATTENTION_8B = AttentionShape(32, 8, 128, 16, (1000, 37, 4096, 513, 16, 2047, 300, 1), 64)
ATTENTION_TINY = AttentionShape(4, 2, 16, 4, (9, 3, 16, 1), 3)


def _paged_inputs(shape: AttentionShape, dtype: torch.dtype, device: torch.device):
    """A cache with every block of every sequence in a shuffled place, and the tables."""
    n = len(shape.context_lens)
    num_blocks = n * shape.max_blocks
    cache = (num_blocks, shape.block_size, shape.kv_heads, shape.head_dim)
    k_cache = torch.randn(cache, device=device).to(dtype)
    v_cache = torch.randn(cache, device=device).to(dtype)
    tables = torch.randperm(num_blocks, device=device).view(n, shape.max_blocks).to(torch.int32)
    lens = torch.tensor(shape.context_lens, dtype=torch.int32, device=device)
    return k_cache, v_cache, tables.contiguous(), lens


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> tuple[float, float]:
    diff = (got.float() - want.float()).abs().max().item()
    return diff, diff / max(want.float().abs().max().item(), 1e-6)


def paged_attention_check(
    shape: AttentionShape, dtype: torch.dtype, device: torch.device
) -> dict[str, Any]:
    """Max errors of paged_decode and paged_extend against the reference; decode timed on CUDA."""
    # Imported here: the runner sets TRITON_INTERPRET first under --interpret.
    from inference.kernels.paged_attention import paged_decode, paged_extend
    from inference.kernels.paged_attention_ref import ref_paged_decode, ref_paged_extend

    torch.manual_seed(0)
    k_cache, v_cache, tables, lens = _paged_inputs(shape, dtype, device)
    n, scale = len(shape.context_lens), shape.head_dim**-0.5
    q = torch.randn(n, shape.heads, shape.head_dim, device=device).to(dtype)
    decode = paged_decode(q, k_cache, v_cache, tables, lens, scale)
    decode_err = _rel_err(decode, ref_paged_decode(q, k_cache, v_cache, tables, lens, scale))

    # Extend: each sequence's last `chunk` tokens (fewer if it is shorter) are new.
    chunks = [min(shape.chunk, length) for length in shape.context_lens]
    starts = torch.tensor(
        [length - c for length, c in zip(shape.context_lens, chunks, strict=True)],
        dtype=torch.int32,
        device=device,
    )
    cu = torch.tensor([0, *torch.tensor(chunks).cumsum(0).tolist()], dtype=torch.int32)
    cu = cu.to(device)
    qx = torch.randn(sum(chunks), shape.heads, shape.head_dim, device=device).to(dtype)
    extend = paged_extend(
        qx, k_cache, v_cache, tables, cu, starts, scale, max_query_len=max(chunks)
    )
    extend_err = _rel_err(extend, ref_paged_extend(qx, k_cache, v_cache, tables, cu, starts, scale))
    figures: dict[str, Any] = {
        "shape": {"heads": shape.heads, "kv_heads": shape.kv_heads, "head_dim": shape.head_dim,
                  "block_size": shape.block_size, "context_lens": list(shape.context_lens)},
        "decode_max_abs_err": float(f"{decode_err[0]:.3g}"),
        "decode_max_rel_err": float(f"{decode_err[1]:.3g}"),
        "extend_max_abs_err": float(f"{extend_err[0]:.3g}"),
        "extend_max_rel_err": float(f"{extend_err[1]:.3g}"),
    }  # fmt: skip
    if device.type == "cuda":
        ms = timer(device, 5, 20)(lambda: paged_decode(q, k_cache, v_cache, tables, lens, scale))
        kv_bytes = 2 * sum(shape.context_lens) * shape.kv_heads * shape.head_dim * dtype.itemsize
        figures["decode_kernel_ms"] = round(ms, 4)
        figures["decode_kernel_kv_gb_s"] = round(kv_bytes / ms / 1e6, 1)
    return figures


def lora_kernels_check(
    tiny: bool, dtype: torch.dtype, device: torch.device, tokens: int, adapters: int
) -> dict[str, Any]:
    """bench/gpu_lora.py's case for one decoder layer: every kernel path against the torch
    reference, timed against the base matmuls."""
    torch.manual_seed(0)
    layer = Layer(layer_linears(LORA_TINY if tiny else LORA_8B), adapters, 16, dtype, device)
    warmup, iters = (0, 1) if tiny else (5, 20)
    measure = timer(device, warmup, iters)
    rows = bench_case(layer, tokens, adapters, (measure, measure, graphed(device, measure)))
    return {
        "tokens": tokens,
        "adapters": adapters,
        "max_rel_err": max(r["max_rel_err"] for r in rows),
        "paths": {r["path"]: r["lora_over_base"] for r in rows},
    }
