"""A quantized linear's checkpoint tensors, whatever wrote them, read into one unpacked form
the loader can merge and shard, and packed back into compressed-tensors' layout, the one
the kernels (inference/kernels/quant_ops.py) take.

Done once per layer, on the host, at load. The unpacked form (`IntParts`) holds each weight
as its stored unsigned value (`q`, [out, in] int32) and its zero point likewise, so that
w = (q - zero) * scale for every format:

- compressed-tensors pack-quantized stores q + 2**(bits-1): without zero points (symmetric)
  the zero is that offset, and asymmetric zero points carry the same offset;
- AutoAWQ GEMM stores [in, out] weights and [groups, out] zeros packed along the outputs,
  eight to an int32 in the order 0, 2, 4, 6, 1, 3, 5, 7, as unsigned values;
- GPTQ (v1) stores [in, out] weights packed along the inputs, zeros packed along the
  outputs as zero - 1 (so a zero is its stored value + 1, modulo 2**bits), and `g_idx`;
  a `g_idx` that is just consecutive groups is dropped.

AWQ's and GPTQ's fp16 scales become fp32, so each weight is the exact product their
references compute; compressed-tensors' scales keep their dtype, as transformers
dequantizes in it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inference.kernels.quant_ref import unpack_int32

from ..errors import ModelLoadError
from ..quantization import QuantizationScheme

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
# the tensors each format stores per linear (beside a bias, which the loader fills itself)
SUFFIXES = {
    "float-quantized": ("weight", "weight_scale", "input_scale"),
    "pack-quantized": (
        "weight_packed",
        "weight_shape",
        "weight_scale",
        "weight_zero_point",
        "weight_g_idx",
    ),
    "awq-gemm": ("qweight", "qzeros", "scales"),
    "gptq": ("qweight", "qzeros", "scales", "g_idx"),
}


@dataclass
class IntParts:
    """One (part of a) linear's integer weights, unpacked: `q` [out, in] and `zero`
    [out, groups] stored unsigned values (zero None: the symmetric offset), `scale`
    [out, groups], `g_idx` [in] or None (consecutive groups)."""

    q: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor | None
    g_idx: torch.Tensor | None


@dataclass
class Fp8Parts:
    """One (part of a) linear's FP8 weight [out, in], its scale [out, 1] (a per-tensor
    scale repeated per row, so merged parts keep their own) and static input scale."""

    weight: torch.Tensor
    scale: torch.Tensor
    input_scale: torch.Tensor | None


Parts = IntParts | Fp8Parts


def read_parts(
    scheme: QuantizationScheme,
    tensors: dict[str, torch.Tensor],
    in_features: int,
    out_features: int,
    where: str,
) -> Parts:
    """The unpacked form of one checkpoint linear `where` (its tensors by suffix)."""

    def need(suffix: str) -> torch.Tensor:
        if suffix not in tensors:
            raise ModelLoadError(
                f"checkpoint has no tensor '{where}.{suffix}', which {scheme.name} stores for "
                "every quantized linear; config.json does not match the weights"
            )
        return tensors[suffix]

    bits = scheme.weights.bits
    if scheme.format == "float-quantized":
        weight = need("weight")
        if weight.dtype != torch.float8_e4m3fn:
            raise ModelLoadError(
                f"checkpoint tensor '{where}.weight' is {weight.dtype}; {scheme.name} stores "
                "float8_e4m3fn weights"
            )
        _shape(where, "weight", weight, (out_features, in_features))
        scale = need("weight_scale")
        if scale.numel() == 1:
            scale = scale.reshape(1, 1).expand(out_features, 1)
        _shape(where, "weight_scale", scale, (out_features, 1))
        static = scheme.activations is not None and not scheme.activations.dynamic
        input_scale = need("input_scale").reshape(1) if static else None
        return Fp8Parts(weight, scale.contiguous(), input_scale)
    if scheme.format == "pack-quantized":
        packed = need("weight_packed")
        _shape(where, "weight_packed", packed, (out_features, -(-in_features * bits // 32)))
        q = unpack_int32(packed, bits, in_features)
        zero = tensors.get("weight_zero_point")
        scale = need("weight_scale")
        if zero is not None:
            zero = unpack_int32(zero, bits, out_features, dim=0)
        g_idx = tensors.get("weight_g_idx") if scheme.weights.actorder else None
        return _checked(IntParts(q, scale, zero, g_idx), scheme, where)
    maxq = (1 << bits) - 1
    if scheme.format == "awq-gemm":
        q = _unpack_awq(need("qweight"), bits, out_features).t()
        zero = _unpack_awq(need("qzeros"), bits, out_features).t()
        g_idx = None
    else:  # gptq
        q = unpack_int32(need("qweight"), bits, in_features, dim=0).t()
        zero = ((unpack_int32(need("qzeros"), bits, out_features) + 1) & maxq).t()
        g_idx = need("g_idx")
    scale = need("scales").t().float()
    parts = IntParts(q.contiguous(), scale.contiguous(), zero.contiguous(), g_idx)
    if g_idx is not None and scheme.weights.group_size is not None:
        consecutive = torch.arange(in_features) // scheme.weights.group_size
        if torch.equal(g_idx.long(), consecutive):
            parts.g_idx = None
    return _checked(parts, scheme, where)


def _unpack_awq(words: torch.Tensor, bits: int, size: int) -> torch.Tensor:
    """AWQ's [rows, out / 8] int32 words -> [rows, out] values, undoing its interleave."""
    values = unpack_int32(words, bits, size)
    order = torch.tensor(AWQ_ORDER)
    columns = torch.empty_like(order)
    columns[order] = torch.arange(len(AWQ_ORDER))
    block = values.reshape(values.shape[0], -1, len(AWQ_ORDER))
    return block[:, :, columns].reshape(values.shape[0], size)


def _checked(parts: IntParts, scheme: QuantizationScheme, where: str) -> IntParts:
    out_features, in_features = parts.q.shape
    size = scheme.weights.group_size
    groups = 1 if size is None else -(-in_features // size)
    _shape(where, "scales", parts.scale, (out_features, groups))
    if parts.zero is not None:
        _shape(where, "zero points", parts.zero, (out_features, groups))
    if parts.g_idx is not None:
        _shape(where, "g_idx", parts.g_idx, (in_features,))
    return parts


def _shape(where: str, what: str, tensor: torch.Tensor, expected: tuple[int, ...]) -> None:
    if tuple(tensor.shape) != expected:
        raise ModelLoadError(
            f"checkpoint tensor '{where}' has {what} of shape {tuple(tensor.shape)}; "
            f"config.json implies {expected}"
        )


def pack_int32(values: torch.Tensor, bits: int) -> torch.Tensor:
    """[rows, cols] unsigned `bits`-bit values -> [rows, ceil(cols * bits / 32)] int32, the
    lowest bits first (compressed-tensors' packing)."""
    per_word = 32 // bits
    rows, cols = values.shape
    padded = torch.zeros(rows, -(-cols // per_word) * per_word, dtype=torch.int64)
    padded[:, :cols] = values
    shifts = torch.arange(per_word, dtype=torch.int64) * bits
    words = (padded.reshape(rows, -1, per_word) << shifts).sum(-1)
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)
