"""The tensors a quantized linear's checkpoint must hold, with their shapes and dtypes, in
each format's own layout; a checkpoint that disagrees with its config.json (scales of the
wrong shape, a packed weight missing) is refused at import, naming the tensor."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from math import ceil

from .scheme import QuantizationError, QuantizationScheme
from .shapes import ModelShapes, pack_factor

SCALE_DTYPES = ("F16", "BF16", "F32")
INT_DTYPES = ("I32", "I64")


@dataclass(frozen=True)
class ExpectedTensor:
    suffix: str  # after the module's name: "weight_scale", "qweight", ...
    shapes: tuple[tuple[int, ...], ...]  # any of these
    dtypes: tuple[str, ...]  # safetensors dtype names, any of these


def expected_tensors(
    scheme: QuantizationScheme, in_features: int, out_features: int
) -> list[ExpectedTensor]:
    """What one quantized linear of weight [out_features, in_features] is stored as."""
    w, pf = scheme.weights, pack_factor(scheme)
    groups = 1 if w.group_size is None else ceil(in_features / w.group_size)
    if scheme.format == "float-quantized":
        per = ((out_features, 1),) if w.granularity == "channel" else ((1,), ())
        found = [
            ExpectedTensor("weight", ((out_features, in_features),), ("F8_E4M3",)),
            ExpectedTensor("weight_scale", per, SCALE_DTYPES),
        ]
        if scheme.activations is not None and not scheme.activations.dynamic:
            found.append(ExpectedTensor("input_scale", ((1,), ()), SCALE_DTYPES))
        return found
    if scheme.format == "pack-quantized":
        found = [
            ExpectedTensor("weight_packed", ((out_features, ceil(in_features / pf)),), ("I32",)),
            ExpectedTensor("weight_shape", ((2,),), INT_DTYPES),
            ExpectedTensor("weight_scale", ((out_features, groups),), SCALE_DTYPES),
        ]
        if not w.symmetric:
            zeros = (ceil(out_features / pf), groups)
            found.append(ExpectedTensor("weight_zero_point", (zeros,), ("I32",)))
        if w.actorder:
            found.append(ExpectedTensor("weight_g_idx", ((in_features,),), INT_DTYPES))
        return found
    if scheme.format == "awq-gemm":  # stored [in, out], packed along the outputs
        return [
            ExpectedTensor("qweight", ((in_features, out_features // pf),), ("I32",)),
            ExpectedTensor("qzeros", ((groups, out_features // pf),), ("I32",)),
            ExpectedTensor("scales", ((groups, out_features),), SCALE_DTYPES),
        ]
    # GPTQ: stored [in, out], the weights packed along the inputs, the zeros along outputs
    return [
        ExpectedTensor("qweight", ((in_features // pf, out_features),), ("I32",)),
        ExpectedTensor("qzeros", ((groups, out_features // pf),), ("I32",)),
        ExpectedTensor("scales", ((groups, out_features),), SCALE_DTYPES),
        ExpectedTensor("g_idx", ((in_features,),), INT_DTYPES),
    ]


def check_checkpoint_tensors(
    scheme: QuantizationScheme,
    fingerprint: ModelShapes,
    tensors: Mapping[str, tuple[str, tuple[int, ...]]],
) -> None:
    """Refuse a checkpoint (tensor name -> (safetensors dtype, shape)) missing a tensor a
    quantized linear needs, or holding one of another shape or dtype."""
    for layer in range(fingerprint.num_layers):
        for module, (in_features, out_features) in fingerprint.modules.items():
            path = fingerprint.module_path(layer, module)
            if not scheme.is_quantized(path):
                continue
            for want in expected_tensors(scheme, in_features, out_features):
                name = f"{path}.{want.suffix}"
                if name not in tensors:
                    raise QuantizationError(
                        f"checkpoint has no tensor {name!r}, which {scheme.name} stores for "
                        f"every quantized linear; config.json does not match the weights"
                    )
                dtype, shape = tensors[name]
                if tuple(shape) not in want.shapes:
                    raise QuantizationError(
                        f"checkpoint tensor {name!r} has shape {list(shape)}; {scheme.name} "
                        f"on a {in_features}x{out_features} linear stores "
                        f"{' or '.join(str(list(s)) for s in want.shapes)}"
                    )
                if dtype not in want.dtypes:
                    raise QuantizationError(
                        f"checkpoint tensor {name!r} is {dtype}; {scheme.name} stores "
                        f"{' or '.join(want.dtypes)}"
                    )
