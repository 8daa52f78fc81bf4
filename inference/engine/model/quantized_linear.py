"""Projections of a quantized base model: the checkpoint's weights kept quantized (packed
int32 or FP8 with their scales, zero points and g_idx), multiplied by quant_ops.quant_linear,
the LoRA hook on top exactly as on a Linear (the adapters stay in the compute dtype).

The loader hands each layer its checkpoint tensors (`receive`) and then `finish_loading`
converts them once: AWQ and GPTQ into compressed-tensors' pack-quantized layout
(quantized_formats.py), the parts of a merged projection (q, k, v; gate, up) stacked
along the outputs, and under tensor parallelism this rank's rows or input columns cut
out (whole groups, as parallel/plan.py's checks guarantee). Parts that cannot share one
GEMM (their own activation order or static input scale) run as separate pieces.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch
from torch import nn

from inference.kernels.quant_ops import Fp8Weights, PackedIntWeights, QuantizedWeights, quant_linear
from inference.kernels.quant_ref import FP8, FP8_MAX, dequantize_packed

from ..errors import ModelLoadError
from ..model_config import ModelConfig
from ..parallel.group import all_reduce, all_reduce_max
from ..quantization import QuantizationScheme
from ..quantization.tensors import expected_tensors
from .layers import Linear
from .parallel_layers import ColumnParallelLinear, RowParallelLinear
from .quantized_formats import SUFFIXES, Fp8Parts, IntParts, Parts, pack_int32, read_parts


class DequantizedWeight:
    """What DoRA reads of a base weight (`weight[rows]`, `shape`), dequantized on access so
    no dense copy stays resident."""

    def __init__(self, linear: QuantizedLinear):
        self.linear = linear

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.linear.out_features, self.linear.in_features))

    def __getitem__(self, rows: slice) -> torch.Tensor:
        blocks = []
        for w in self.linear.pieces:
            if isinstance(w, Fp8Weights):  # its scale is per row here (quantized_formats)
                blocks.append(w.weight.float() * w.weight_scale.float().reshape(-1, 1))
            else:
                blocks.append(
                    dequantize_packed(
                        w.weight_packed,
                        w.weight_scale,
                        w.bits,
                        w.in_features,
                        w.weight_zero_point,
                        w.g_idx,
                    )  # fmt: skip
                )
        return torch.cat(blocks)[rows].to(self.linear.compute_dtype)


class QuantizedLinear(Linear):
    """A Linear (same output_sizes, bias and LoRA hook) whose weight stays quantized.
    `names`: the checkpoint's module name of each merged part."""

    def __init__(
        self,
        in_features: int,
        output_sizes: list[int],
        bias: bool,
        scheme: QuantizationScheme,
        names: Sequence[str],
    ):
        nn.Module.__init__(self)
        self.in_features = in_features
        self.output_sizes = list(output_sizes)
        self.out_features = sum(output_sizes)
        self.bias = (
            nn.Parameter(torch.empty(self.out_features), requires_grad=False) if bias else None
        )
        self.lora = None
        self.scheme, self.names = scheme, list(names)
        probe = torch.empty(0)  # the device and dtype the model is being built with
        self.device, self.compute_dtype = probe.device, probe.dtype
        self.pending: dict[tuple[int, str], torch.Tensor] = {}
        self.pieces: list[QuantizedWeights] = []
        self.add_bias = True

    @property
    def weight(self) -> DequantizedWeight:  # type: ignore[override]  # no dense Parameter
        return DequantizedWeight(self)

    def receive(self, part: int, suffix: str, tensor: torch.Tensor, key: str) -> None:
        if suffix not in SUFFIXES[self.scheme.format]:
            raise ModelLoadError(
                f"checkpoint tensor {key!r} is not one {self.scheme.name} stores; config.json "
                "does not match the weights"
            )
        if self.pieces:
            raise ModelLoadError(f"checkpoint tensor {key!r} appears twice")
        self.pending[(part, suffix)] = tensor

    def complete(self) -> bool:
        """Whether every part's tensors are in, so the layer can be converted now (and
        the host need not hold the whole checkpoint until the last file is read)."""
        for part in range(len(self.names)):
            wanted = expected_tensors(self.scheme, self.full_in_features, self.full_part_size(part))
            if any((part, w.suffix) not in self.pending for w in wanted):
                return False
        return True

    @property
    def loaded(self) -> bool:
        return bool(self.pieces)

    def finish_loading(self) -> None:
        parts = []
        for part, name in enumerate(self.names):
            tensors = {s: t for (p, s), t in self.pending.items() if p == part}
            parts.append(self._read(part, name, tensors))
        self.pending = {}
        pieces: list[list[Parts]] = []
        for p in parts:  # consecutive parts that can share one GEMM are stacked
            if pieces and _compatible(pieces[-1][-1], p):
                pieces[-1].append(p)
            else:
                pieces.append([p])
        self.pieces = [self._weights(group) for group in pieces]
        # registered, so module.buffers() sees (and counts) them; the model is built on its
        # device and never moved, so `pieces` keeps pointing at these same tensors
        for i, weights in enumerate(self.pieces):
            for field, tensor in vars(weights).items():
                if isinstance(tensor, torch.Tensor):
                    self.register_buffer(f"piece{i}_{field}", tensor, persistent=False)

    def _read(self, part: int, name: str, tensors: dict[str, torch.Tensor]) -> Parts:
        full_out = self.full_part_size(part)
        parts = read_parts(self.scheme, tensors, self.full_in_features, full_out, name)
        return self.shard(parts, part)

    @property
    def full_in_features(self) -> int:
        return self.in_features

    def full_part_size(self, part: int) -> int:
        return self.output_sizes[part]

    def shard(self, parts: Parts, part: int) -> Parts:
        """This rank's share of one part (all of it without tensor parallelism)."""
        return parts

    def _weights(self, group: list[Parts]) -> QuantizedWeights:
        device = self.device
        first = group[0]
        if isinstance(first, Fp8Parts):
            fp8 = [p for p in group if isinstance(p, Fp8Parts)]
            input_scale = first.input_scale
            return Fp8Weights(
                weight=torch.cat([p.weight for p in fp8]).to(device),
                weight_scale=torch.cat([p.scale for p in fp8]).to(device),
                input_scale=None if input_scale is None else _own(input_scale, device),
                quantize_activations=self.scheme.activations is not None,
            )
        ints = [p for p in group if isinstance(p, IntParts)]
        bits = self.scheme.weights.bits
        zero = None
        if first.zero is not None:
            stacked = torch.cat([p.zero for p in ints if p.zero is not None])
            zero = pack_int32(stacked.t(), bits).t().contiguous().to(device)
        return PackedIntWeights(
            weight_packed=pack_int32(torch.cat([p.q for p in ints]), bits).to(device),
            weight_scale=torch.cat([p.scale for p in ints]).to(device),
            bits=bits,
            weight_zero_point=zero,
            g_idx=None if first.g_idx is None else _own(first.g_idx, device),
        )

    def gemm(self, x: torch.Tensor) -> torch.Tensor:
        """x @ W^T, without the bias."""
        if not self.pieces:
            raise RuntimeError("a quantized linear runs after its weights are loaded")
        outs = [quant_linear(x, weights) for weights in self.pieces]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        out = self.gemm(x)
        if self.bias is not None and self.add_bias:
            out += self.bias
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.matmul(x)
        if self.lora is not None:
            self.lora.apply(out, x)
        return out

    def resident_bytes(self) -> int:
        tensors = [t for t in self.buffers(recurse=False)]
        if self.bias is not None:
            tensors.append(self.bias)
        return sum(t.numel() * t.element_size() for t in tensors)


def _own(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A copy in memory of its own: a checkpoint's tensor may start anywhere in its file,
    and Triton compiles a variant per pointer alignment (warm-up lists 16-byte aligned)."""
    return tensor.to(device, copy=True)


def _compatible(a: Parts, b: Parts) -> bool:
    """Whether two parts can share one GEMM: the same activation order or input scale."""
    if isinstance(a, IntParts) and isinstance(b, IntParts):
        if (a.zero is None) != (b.zero is None):
            return False
        if a.g_idx is None or b.g_idx is None:
            return a.g_idx is None and b.g_idx is None
        return torch.equal(a.g_idx, b.g_idx)
    if isinstance(a, Fp8Parts) and isinstance(b, Fp8Parts):
        if a.input_scale is None or b.input_scale is None:
            return a.input_scale is None and b.input_scale is None
        return torch.equal(a.input_scale, b.input_scale)
    return False


class QuantizedColumnParallelLinear(QuantizedLinear):
    """ColumnParallelLinear's split (output rows, LoRA's B by the same rows), quantized:
    each part's rows, with their scales and zero points, cut before packing."""

    def __init__(
        self,
        in_features: int,
        full_sizes: list[int],
        rows: list[slice],
        bias: bool,
        scheme: QuantizationScheme,
        names: Sequence[str],
    ):
        sizes = [r.stop - r.start for r in rows]
        super().__init__(in_features, sizes, bias, scheme, names)
        self.full_sizes, self.rows = list(full_sizes), rows

    take_shard = ColumnParallelLinear.take_shard  # the bias
    shard_factors = ColumnParallelLinear.shard_factors

    def full_part_size(self, part: int) -> int:
        return self.full_sizes[part]

    def shard(self, parts: Parts, part: int) -> Parts:
        rows = self.rows[part]
        if isinstance(parts, Fp8Parts):
            return Fp8Parts(parts.weight[rows], parts.scale[rows], parts.input_scale)
        zero = None if parts.zero is None else parts.zero[rows]
        return IntParts(parts.q[rows], parts.scale[rows], zero, parts.g_idx)


class QuantizedRowParallelLinear(QuantizedLinear):
    """RowParallelLinear's split (input columns, LoRA's A by the same columns, one
    all-reduce, the bias on rank 0), quantized: whole groups of columns per rank; with an
    activation order every group's scale stays and g_idx is cut instead."""

    def __init__(
        self,
        columns: slice,
        out_features: int,
        bias: bool,
        rank: int,
        full_in_features: int,
        scheme: QuantizationScheme,
        names: Sequence[str],
    ):
        super().__init__(columns.stop - columns.start, [out_features], bias, scheme, names)
        self.columns, self.first_rank = columns, rank == 0
        self.add_bias = self.first_rank
        self._full_in = full_in_features
        self.full_row_scales = False

    take_shard = RowParallelLinear.take_shard
    shard_factors = RowParallelLinear.shard_factors

    @property
    def full_in_features(self) -> int:
        return self._full_in

    def shard(self, parts: Parts, part: int) -> Parts:
        cols = self.columns
        if isinstance(parts, Fp8Parts):
            return Fp8Parts(parts.weight[:, cols], parts.scale, parts.input_scale)
        if parts.g_idx is not None:
            return IntParts(parts.q[:, cols], parts.scale, parts.zero, parts.g_idx[cols])
        size = self.scheme.weights.group_size
        if size is None:  # one scale per output row
            return IntParts(parts.q[:, cols], parts.scale, parts.zero, None)
        groups = slice(cols.start // size, cols.stop // size)
        zero = None if parts.zero is None else parts.zero[:, groups]
        return IntParts(parts.q[:, cols], parts.scale[:, groups], zero, None)

    def finish_loading(self) -> None:
        super().finish_loading()
        acts = self.scheme.activations
        if acts is not None and acts.dynamic:  # see gemm
            self.pieces = [
                dataclasses.replace(w, quantize_activations=False)
                if isinstance(w, Fp8Weights)
                else w
                for w in self.pieces
            ]
            self.full_row_scales = True

    def gemm(self, x: torch.Tensor) -> torch.Tensor:
        """Per-token FP8 activation scales are the whole row's: each rank holds some of a
        token's inputs, so the ranks agree on its amax first, quantize their columns by it,
        and multiply the quantized values (in the compute dtype) by the weights, weight-only."""
        if self.full_row_scales:
            amax = all_reduce_max(x.abs().amax(dim=-1, keepdim=True).float())
            scale = torch.where(amax == 0, torch.finfo(torch.float32).eps, amax / FP8_MAX)
            xq = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
            return super().gemm((xq.float() * scale).to(x.dtype))
        return super().gemm(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.matmul(x)
        if self.lora is not None:
            self.lora.apply(out, x)
        return all_reduce(out)


def _names(layer: int, modules: Sequence[str]) -> list[str]:
    parent = "mlp" if modules[0] in ("gate_proj", "up_proj", "down_proj") else "self_attn"
    return [f"model.layers.{layer}.{parent}.{m}" for m in modules]


def _scheme_of(mc: ModelConfig, names: list[str]) -> QuantizationScheme | None:
    """The scheme these checkpoint modules are quantized with, None if they are not."""
    scheme = mc.quantization
    if scheme is None:
        return None
    quantized = {scheme.is_quantized(n) for n in names}
    if len(quantized) > 1:
        raise ModelLoadError(
            f"{', '.join(names)} are merged into one projection, but the checkpoint quantizes "
            "only some of them; the engine serves them quantized alike"
        )
    return scheme if quantized.pop() else None


def make_linear(
    mc: ModelConfig,
    layer: int,
    modules: Sequence[str],
    in_features: int,
    output_sizes: list[int],
    bias: bool,
) -> Linear:
    """A Linear, or its quantized form when the checkpoint quantizes `modules`."""
    names = _names(layer, modules)
    scheme = _scheme_of(mc, names)
    if scheme is None:
        return Linear(in_features, output_sizes, bias)
    return QuantizedLinear(in_features, output_sizes, bias, scheme, names)


def make_column_parallel(
    mc: ModelConfig,
    layer: int,
    modules: Sequence[str],
    in_features: int,
    full_sizes: list[int],
    rows: list[slice],
    bias: bool,
) -> Linear:
    names = _names(layer, modules)
    scheme = _scheme_of(mc, names)
    if scheme is None:
        return ColumnParallelLinear(in_features, full_sizes, rows, bias)
    return QuantizedColumnParallelLinear(in_features, full_sizes, rows, bias, scheme, names)


def make_row_parallel(
    mc: ModelConfig,
    layer: int,
    module: str,
    columns: slice,
    out_features: int,
    bias: bool,
    rank: int,
    full_in_features: int,
) -> Linear:
    names = _names(layer, [module])
    scheme = _scheme_of(mc, names)
    if scheme is None:
        return RowParallelLinear(columns, out_features, bias, rank)
    return QuantizedRowParallelLinear(
        columns, out_features, bias, rank, full_in_features, scheme, names
    )


def weight_bytes(
    model: nn.Module, quantized: Callable[[QuantizedLinear], int] | None = None
) -> tuple[int, int]:
    """(bytes the model's weights take resident, bytes they would take in bf16).
    `quantized`: what a quantized linear takes, when not read from its loaded buffers (the
    capacity planner counts a model built on the meta device with `stored_bytes`)."""
    resident = bf16 = 0
    seen: set[int] = set()
    for module in model.modules():
        if isinstance(module, QuantizedLinear):
            resident += module.resident_bytes() if quantized is None else quantized(module)
            bias = module.out_features if module.bias is not None else 0
            bf16 += 2 * (module.out_features * module.in_features + bias)
            continue
        for p in module.parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            resident += p.numel() * p.element_size()
            bf16 += 2 * p.numel()
    return resident, bf16


# safetensors dtypes a quantized linear's resident tensors are kept in; scales at 16 bits, as
# llmcompressor writes them
_DTYPE_BYTES = {"F8_E4M3": 1, "I32": 4, "I64": 8, "F16": 2, "BF16": 2, "F32": 4}
_NOT_RESIDENT = ("weight_shape",)  # read at load, not kept


def stored_bytes(linear: QuantizedLinear) -> int:
    """What a quantized linear holds once loaded, from its scheme and this rank's shapes
    alone: each part's tensors as its format stores them, plus the bias."""
    total = 0 if linear.bias is None else linear.out_features * linear.compute_dtype.itemsize
    for rows in linear.output_sizes:
        for tensor in expected_tensors(linear.scheme, linear.in_features, rows):
            if tensor.suffix in _NOT_RESIDENT:
                continue
            numel = 1
            for n in tensor.shapes[0]:
                numel *= n
            total += numel * _DTYPE_BYTES[tensor.dtypes[0]]
    return total
