"""The quantized-weight GEMMs on Triton, with quant_ref.py's signatures: this module picks
tiles by the number of rows (decode's few tokens or a prefill chunk) and launches the
kernels of quant_kernels.py.

Any strides are read; packed integer weights and their scales read fastest stored
output-major (quant_ops.PackedIntWeights.output_major): a tile's words then load as
16-byte vectors. Launches depend on shapes only: no host sync, and the only allocations
(the FP8 activations and their scales, and `out` when not given) are sized by x's shape,
so a step can be captured in a CUDA graph.
Set TRITON_INTERPRET=1 before importing this module to run it on CPU tensors (tests only).
"""

from dataclasses import dataclass

import torch
import triton

from inference.kernels.quant_kernels import (
    fp8_gemm_kernel,
    fp8_quantize_rows_kernel,
    fp8_weight_only_gemm_kernel,
    int_weight_gemm_kernel,
)
from inference.kernels.quant_ref import FP8, check_fp8_weight, check_packed


@dataclass(frozen=True)
class GemmTiles:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 2


# By the most rows a tile serves: decode's GEMV shapes (a 16-row dot tile, the least
# tl.dot takes; narrow N tiles so a 4096-wide output still has 128 programs), then prefill.
INT_TILES = (
    (16, GemmTiles(16, 32, 128)),
    (32, GemmTiles(32, 64, 64)),
    (64, GemmTiles(64, 64, 32)),
    (None, GemmTiles(64, 128, 32, num_warps=8, num_stages=3)),
)
# fp32 activations take IEEE dots (FMAs on CUDA cores, operands in registers): the tiles
# above would spill kilobytes per thread
FP32_TILES = (
    (16, GemmTiles(16, 32, 32)),
    (None, GemmTiles(32, 32, 32)),
)
FP8_TILES = (
    (16, GemmTiles(16, 64, 128)),
    (32, GemmTiles(32, 64, 128)),
    (64, GemmTiles(64, 64, 128)),
    (None, GemmTiles(128, 128, 64, num_warps=8, num_stages=3)),
)
# The weight-only FP8 fallback computes in fp32 tiles like the integer GEMM
FP8_WEIGHT_ONLY_TILES = INT_TILES
TileTable = tuple[tuple[int | None, GemmTiles], ...]
QUANTIZE_BLOCK_K = 1024


def gemm_tiles(table: TileTable, rows: int) -> GemmTiles:
    """The first entry of `table` whose row bound covers `rows` (None covers any)."""
    for bound, tiles in table:
        if bound is None or rows <= bound:
            return tiles
    raise ValueError("a tile table ends with an entry for any number of rows")


def _fp32_or(table: TileTable, dtype: torch.dtype) -> TileTable:
    """`table`, or FP32_TILES for fp32 activations (whose dots are IEEE)."""
    return FP32_TILES if dtype == torch.float32 else table


def _precision(dtype: torch.dtype) -> str:
    """tf32 dots are exact on 16-bit activations and integer weights (quant_kernels.py)."""
    return "ieee" if dtype == torch.float32 else "tf32"


def _out(x: torch.Tensor, out_features: int, out: torch.Tensor | None) -> torch.Tensor:
    if out is None:
        return torch.empty(x.shape[0], out_features, dtype=x.dtype, device=x.device)
    return out


def _launch(tiles: GemmTiles) -> dict[str, int]:
    return {"num_warps": tiles.num_warps, "num_stages": tiles.num_stages}


def int_weight_gemm(
    x: torch.Tensor,
    weight_packed: torch.Tensor,
    weight_scale: torch.Tensor,
    bits: int,
    weight_zero_point: torch.Tensor | None = None,
    g_idx: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    tiles: GemmTiles | None = None,
) -> torch.Tensor:
    m, k = x.shape
    n = weight_packed.shape[0]
    group_size = check_packed(weight_packed, weight_scale, bits, k, weight_zero_point, g_idx)
    t = tiles or gemm_tiles(_fp32_or(INT_TILES, x.dtype), m)
    block_k = t.block_k
    per_channel = weight_scale.shape[1] == 1
    if not per_channel and g_idx is None:
        # a K tile within one group, when the group is a power of two of 16 or more
        fits = group_size >= 16 and group_size & (group_size - 1) == 0
        block_k = min(block_k, group_size) if fits else block_k
    tile_group = g_idx is None and (per_channel or group_size % block_k == 0)
    out = _out(x, n, out)
    zero = weight_zero_point if weight_zero_point is not None else weight_packed
    gidx = g_idx if g_idx is not None else weight_packed
    grid = (triton.cdiv(m, t.block_m), triton.cdiv(n, t.block_n))
    int_weight_gemm_kernel[grid](
        x, weight_packed, weight_scale, zero, gidx, out,
        m, n, k, group_size,
        *x.stride(), *weight_packed.stride(), *weight_scale.stride(), *zero.stride(),
        *out.stride(),
        BITS=bits, HAS_ZERO=weight_zero_point is not None, HAS_GIDX=g_idx is not None,
        TILE_GROUP=tile_group, BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=block_k,
        PRECISION=_precision(x.dtype), **_launch(t),
    )  # fmt: skip
    return out


def quantize_fp8_rows(
    x: torch.Tensor, input_scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    m, k = x.shape
    xq = torch.empty(m, k, dtype=FP8, device=x.device)
    xs = torch.empty(m, 1, dtype=torch.float32, device=x.device)
    scale = input_scale if input_scale is not None else xs
    fp8_quantize_rows_kernel[(m,)](
        x, xq, xs, scale, k, *x.stride(), *xq.stride(),
        STATIC=input_scale is not None, BLOCK_K=min(QUANTIZE_BLOCK_K, _pow2(k)),
    )  # fmt: skip
    return xq, xs


def _pow2(n: int) -> int:
    return max(16, int(triton.next_power_of_2(n)))


def fp8_gemm(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    input_scale: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    tiles: GemmTiles | None = None,
) -> torch.Tensor:
    """Needs fp8 tensor cores (sm_89+); the weight-only form runs on sm_80."""
    per_channel = check_fp8_weight(weight, weight_scale)
    m, k = x.shape
    n = weight.shape[0]
    xq, xs = quantize_fp8_rows(x, input_scale)
    out = _out(x, n, out)
    t = tiles or gemm_tiles(FP8_TILES, m)
    grid = (triton.cdiv(m, t.block_m), triton.cdiv(n, t.block_n))
    fp8_gemm_kernel[grid](
        xq, xs, weight, weight_scale.reshape(-1), out, m, n, k,
        *xq.stride(), *weight.stride(), *out.stride(),
        WS_PER_CHANNEL=per_channel, BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k,
        **_launch(t),
    )  # fmt: skip
    return out


def fp8_weight_only_gemm(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    out: torch.Tensor | None = None,
    tiles: GemmTiles | None = None,
) -> torch.Tensor:
    per_channel = check_fp8_weight(weight, weight_scale)
    m, k = x.shape
    n = weight.shape[0]
    out = _out(x, n, out)
    t = tiles or gemm_tiles(_fp32_or(FP8_WEIGHT_ONLY_TILES, x.dtype), m)
    grid = (triton.cdiv(m, t.block_m), triton.cdiv(n, t.block_n))
    fp8_weight_only_gemm_kernel[grid](
        x, weight.view(torch.uint8), weight_scale.reshape(-1), out, m, n, k,
        *x.stride(), *weight.stride(), *out.stride(),
        WS_PER_CHANNEL=per_channel, BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k,
        PRECISION=_precision(x.dtype), **_launch(t),
    )  # fmt: skip
    return out
