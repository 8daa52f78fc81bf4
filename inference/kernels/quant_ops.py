"""The quantized linear the engine calls: a layer's weights as the checkpoint stores them,
and the backend that runs the GEMM (Triton on CUDA, the torch reference elsewhere, as
backend.select_backend chooses for the LoRA ops).

The layouts are quant_ref.py's. On a GPU without fp8 tensor cores (before sm_89) an FP8
layer runs weight-only: its activations stay in the compute dtype instead of being
quantized, so the result is closer to the unquantized model than the checkpoint's scheme,
and not equal to the torch reference's.
"""

import dataclasses
import functools
import os
from dataclasses import dataclass
from types import ModuleType

import torch

from inference.kernels import quant_ref
from inference.kernels.backend import check_backend, select_backend

FP8_TENSOR_CORES = (8, 9)


@dataclass(frozen=True)
class PackedIntWeights:
    """compressed-tensors pack-quantized: 4- or 8-bit integers packed in int32."""

    weight_packed: torch.Tensor  # int32 [out, in * bits / 32]
    weight_scale: torch.Tensor  # [out, groups]; groups = 1 per channel
    bits: int
    weight_zero_point: torch.Tensor | None = None  # int32 [ceil(out * bits / 32), groups]
    g_idx: torch.Tensor | None = None  # int [in]: each input column's group

    @property
    def out_features(self) -> int:
        return int(self.weight_packed.shape[0])

    @property
    def in_features(self) -> int:
        return int(self.weight_packed.shape[1]) * 32 // self.bits

    def output_major(self) -> "PackedIntWeights":
        """The same tensors, their memory transposed so that outputs are adjacent (shapes
        and values unchanged). Store a layer this way, once at load: the Triton kernel
        then reads a tile's words as 16-byte vectors along the outputs, where the
        checkpoint's input-major rows give it scattered 4-byte loads."""
        return dataclasses.replace(
            self,
            weight_packed=self.weight_packed.t().contiguous().t(),
            weight_scale=self.weight_scale.t().contiguous().t(),
        )


@dataclass(frozen=True)
class Fp8Weights:
    """compressed-tensors float-quantized: e4m3 weights with a scale per channel or tensor;
    activations quantized per token (dynamic), by `input_scale` (static), or not at all."""

    weight: torch.Tensor  # float8_e4m3fn [out, in]
    weight_scale: torch.Tensor  # [out, 1] or one element
    input_scale: torch.Tensor | None = None  # one element: static activation scale
    quantize_activations: bool = True

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[0])

    @property
    def in_features(self) -> int:
        return int(self.weight.shape[1])


QuantizedWeights = PackedIntWeights | Fp8Weights


def _impl(backend: str) -> ModuleType:
    if backend == "triton":
        # Imported here only: defining @triton.jit kernels must never happen on a CPU engine.
        from inference.kernels import quant_triton

        return quant_triton
    return quant_ref


@functools.cache
def fp8_tensor_cores(device: torch.device) -> bool:
    """Whether `device` multiplies e4m3 operands (sm_89+; Triton's interpreter does too)."""
    if device.type != "cuda":
        return os.environ.get("TRITON_INTERPRET") == "1"
    return torch.cuda.get_device_capability(device) >= FP8_TENSOR_CORES


def quant_linear(
    x: torch.Tensor,
    weights: QuantizedWeights,
    backend: str | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [..., in] @ W^T -> [..., out] in x's dtype, W dequantized from `weights` on the fly;
    `out` ([tokens, out], when given) receives it."""
    device = x.device
    if backend is None:
        backend = select_backend(device)
    else:
        check_backend(backend, device, source="quant_linear backend")
    if x.shape[-1] != weights.in_features:
        raise ValueError(
            f"x has {x.shape[-1]} features, the quantized layer takes {weights.in_features}"
        )
    rows = x.reshape(-1, x.shape[-1])
    impl = _impl(backend)
    y: torch.Tensor
    if isinstance(weights, PackedIntWeights):
        y = impl.int_weight_gemm(
            rows, weights.weight_packed, weights.weight_scale, weights.bits,
            weights.weight_zero_point, weights.g_idx, out=out,
        )  # fmt: skip
    elif weights.quantize_activations and (backend == "torch" or fp8_tensor_cores(device)):
        y = impl.fp8_gemm(rows, weights.weight, weights.weight_scale, weights.input_scale, out)
    else:
        y = impl.fp8_weight_only_gemm(rows, weights.weight, weights.weight_scale, out)
    return y.reshape(*x.shape[:-1], weights.out_features)
