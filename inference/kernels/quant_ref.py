"""Torch references of the quantized-weight GEMMs: what the Triton kernels (quant_triton.py)
must compute, and what runs on CPU.

The weights stay as the checkpoint stores them; a call dequantizes one layer, a block of
output rows at a time, so no dequantized copy of the model ever exists.

- Packed integers (compressed-tensors "pack-quantized"): `weight_packed` int32
  [out, in * bits / 32], each word holding 32 / bits values along the input dimension,
  lowest bits first, every value stored as q + 2**(bits-1) (q signed). `weight_scale`
  [out, groups] (groups = 1: per channel). Zero points, when the scheme is asymmetric, are
  packed the same way along the output dimension: int32 [ceil(out * bits / 32), groups].
  `g_idx` (activation order) names the group of each input column; without it column k is
  in group k // (in / groups). w = (q - zero) * scale, y = x @ w^T.
- FP8 (compressed-tensors "float-quantized"): `weight` float8_e4m3fn [out, in], its scale
  [out, 1] or a scalar; activations quantized to e4m3 per token (scale amax / 448) or by a
  stored per-tensor `input_scale`; y = (xq * xs) @ (wq * ws)^T. Without fp8 tensor cores
  (sm_80) the weight-only form runs instead: y = x @ (wq * ws)^T.
"""

from collections.abc import Callable

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
BITS = (4, 8)
# Elements of one dequantized block of output rows: bounds a call's extra memory
DEQUANT_BLOCK_ELEMENTS = 1 << 24


def check_packed(
    weight_packed: torch.Tensor,
    weight_scale: torch.Tensor,
    bits: int,
    in_features: int,
    weight_zero_point: torch.Tensor | None = None,
    g_idx: torch.Tensor | None = None,
) -> int:
    """The group size of a packed layer, after refusing tensors that do not fit together;
    shapes only, so nothing waits on the device."""
    if bits not in BITS:
        raise ValueError(f"{bits}-bit weights are not supported; use one of {BITS}")
    pack = 32 // bits
    out_features, words = weight_packed.shape
    if weight_packed.dtype != torch.int32 or in_features % pack or words * pack != in_features:
        raise ValueError(
            f"weight_packed {tuple(weight_packed.shape)} {weight_packed.dtype} does not hold "
            f"{in_features} {bits}-bit inputs per row packed in int32"
        )
    groups = weight_scale.shape[-1] if weight_scale.dim() == 2 else 0
    if weight_scale.shape[0] != out_features or groups == 0 or in_features % groups:
        raise ValueError(
            f"weight_scale {tuple(weight_scale.shape)} does not fit {out_features} outputs "
            f"and {in_features} inputs"
        )
    if weight_zero_point is not None:
        expected = (-(-out_features * bits // 32), groups)
        if weight_zero_point.dtype != torch.int32 or tuple(weight_zero_point.shape) != expected:
            raise ValueError(
                f"weight_zero_point {tuple(weight_zero_point.shape)} "
                f"{weight_zero_point.dtype} is not int32 {expected}"
            )
    if g_idx is not None and tuple(g_idx.shape) != (in_features,):
        raise ValueError(f"g_idx {tuple(g_idx.shape)} has not one entry per input column")
    return in_features // groups


def unpack_int32(packed: torch.Tensor, bits: int, size: int, dim: int = 1) -> torch.Tensor:
    """The stored (offset, unsigned) values of `packed` along `dim`, `size` of them, int32."""
    pack = 32 // bits
    words = packed.transpose(0, 1) if dim == 0 else packed
    shifts = torch.arange(pack, device=packed.device, dtype=torch.int32) * bits
    values = (words.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    values = values.flatten(1)[:, :size]
    return values.transpose(0, 1) if dim == 0 else values


def dequantize_packed(
    weight_packed: torch.Tensor,
    weight_scale: torch.Tensor,
    bits: int,
    in_features: int,
    weight_zero_point: torch.Tensor | None = None,
    g_idx: torch.Tensor | None = None,
    rows: slice = slice(None),
) -> torch.Tensor:
    """Output rows `rows` of the weight, [rows, in], in the scale's dtype (as
    compressed-tensors dequantizes)."""
    group_size = check_packed(
        weight_packed, weight_scale, bits, in_features, weight_zero_point, g_idx
    )
    out_features = weight_packed.shape[0]
    q = unpack_int32(weight_packed[rows], bits, in_features)
    if weight_zero_point is None:
        zero = torch.full((1, 1), 1 << (bits - 1), dtype=torch.int32, device=q.device)
    else:
        zero = unpack_int32(weight_zero_point, bits, out_features, dim=0)[rows]
    scale = weight_scale[rows]
    if g_idx is None:
        group = torch.arange(in_features, device=q.device) // group_size
    else:
        group = g_idx.to(device=q.device, dtype=torch.long)
    if zero.shape[1] > 1:
        zero = zero[:, group]
    if scale.shape[1] > 1:
        scale = scale[:, group]
    return (q - zero).to(scale.dtype) * scale


def int_weight_gemm(
    x: torch.Tensor,
    weight_packed: torch.Tensor,
    weight_scale: torch.Tensor,
    bits: int,
    weight_zero_point: torch.Tensor | None = None,
    g_idx: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [M, in] @ dequantized(weight)^T -> [M, out] in x's dtype, written into `out` when
    given."""
    in_features = x.shape[-1]

    def rows_of(rows: slice) -> torch.Tensor:
        return dequantize_packed(
            weight_packed, weight_scale, bits, in_features, weight_zero_point, g_idx, rows
        ).to(x.dtype)

    return _by_row_blocks(x, weight_packed.shape[0], rows_of, out)


def _by_row_blocks(
    x: torch.Tensor,
    out_features: int,
    rows_of: Callable[[slice], torch.Tensor],
    out: torch.Tensor | None,
) -> torch.Tensor:
    """x @ w^T a block of w's rows at a time, `rows_of` dequantizing each block."""
    if out is None:
        out = torch.empty(x.shape[0], out_features, dtype=x.dtype, device=x.device)
    step = max(1, DEQUANT_BLOCK_ELEMENTS // max(1, x.shape[-1]))
    for first in range(0, out_features, step):
        rows = slice(first, min(first + step, out_features))
        out[:, rows] = torch.nn.functional.linear(x, rows_of(rows)).to(out.dtype)
    return out


def quantize_fp8_rows(
    x: torch.Tensor, input_scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """x in e4m3 and its fp32 scale: per row (amax / 448, dynamic) or the stored
    per-tensor `input_scale` (static), [M, 1] either way."""
    xf = x.float()
    if input_scale is None:
        scale = xf.abs().amax(dim=-1, keepdim=True) / FP8_MAX
        scale = torch.where(scale == 0, torch.finfo(torch.float32).eps, scale)
    else:
        scale = input_scale.float().reshape(1, 1).expand(x.shape[0], 1)
    xq = (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return xq, scale


def check_fp8_weight(weight: torch.Tensor, weight_scale: torch.Tensor) -> bool:
    """Refuse what is not an e4m3 [out, in] weight with a scale per tensor or per output
    channel; whether the scale is per channel."""
    if weight.dtype != FP8 or weight.dim() != 2:
        raise ValueError(f"an FP8 weight is float8_e4m3fn [out, in], not {weight.dtype}")
    if weight_scale.numel() not in (1, weight.shape[0]):
        raise ValueError(
            f"weight_scale {tuple(weight_scale.shape)} is neither per tensor nor per channel "
            f"of {weight.shape[0]} outputs"
        )
    return weight_scale.numel() != 1 or weight.shape[0] == 1


def _fp8_weight_scale(weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """The weight's scale as fp32 [out, 1], per channel or one for the tensor."""
    if not check_fp8_weight(weight, weight_scale):
        return weight_scale.float().reshape(1, 1).expand(weight.shape[0], 1)
    return weight_scale.float().reshape(-1, 1)


def fp8_gemm(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    input_scale: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """FP8 weights and activations: x quantized per token (or by `input_scale`), then
    (xq * xs) @ (wq * ws)^T in fp32, cast to x's dtype."""
    ws = _fp8_weight_scale(weight, weight_scale)
    xq, xs = quantize_fp8_rows(x, input_scale)
    y = _by_row_blocks(xq.float(), weight.shape[0], lambda rows: weight[rows].float(), None)
    return _written((y * xs * ws.t()).to(x.dtype), out)


def fp8_weight_only_gemm(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """FP8 weights, 16-bit (or fp32) activations: x @ (wq * ws)^T, accumulated in fp32."""
    ws = _fp8_weight_scale(weight, weight_scale)
    y = _by_row_blocks(x.float(), weight.shape[0], lambda rows: weight[rows].float(), None)
    return _written((y * ws.t()).to(x.dtype), out)


def _written(y: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    if out is None:
        return y
    out.copy_(y)
    return out
