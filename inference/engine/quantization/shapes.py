"""Whether a quantized linear's shape can be served: its groups must tile the input
columns, and the ints its values are packed into must not straddle a tensor-parallel
shard or a fused module's slice. Refused with the reason before any weight loads."""

from __future__ import annotations

from typing import Protocol

from .scheme import QuantizationError, QuantizationScheme

ROW_PARALLEL = ("o_proj", "down_proj")  # split along the input columns; the rest by rows


class ModelShapes(Protocol):
    """What these checks read of the engine's ArchFingerprint (which itself holds the
    scheme, so it cannot be imported here)."""

    @property
    def num_layers(self) -> int: ...

    @property
    def kv_heads(self) -> int: ...

    @property
    def head_dim(self) -> int: ...

    @property
    def modules(self) -> dict[str, tuple[int, int]]: ...

    def slices(self, module: str) -> list[tuple[str, int]]: ...

    def module_path(self, layer: int, module: str) -> str: ...


def pack_factor(scheme: QuantizationScheme) -> int:
    """Values per int32 of the packed weight (1 for FP8, which is not packed)."""
    return 1 if scheme.weights.type == "float" else 32 // scheme.weights.bits


def packed_along_out(scheme: QuantizationScheme) -> bool:
    """Whether values packed into one int32 run along the output rows somewhere (AWQ's
    weights and zeros, GPTQ's zeros, compressed-tensors' asymmetric zero points)."""
    if scheme.format in ("awq-gemm", "gptq"):
        return True
    return scheme.format == "pack-quantized" and not scheme.weights.symmetric


def check_module_shapes(
    scheme: QuantizationScheme,
    module: str,
    in_features: int,
    out_features: int,
    tp_size: int = 1,
    *,
    row_parallel: bool = False,
    rows_per_rank: int | None = None,
    out_slices: tuple[int, ...] = (),
) -> None:
    """Refuse a linear of this shape, split `tp_size` ways (by input columns if
    `row_parallel`, else by output rows), whose groups or packed ints would split.
    `rows_per_rank`: where a rank holds other than out_features / tp_size rows (a copied KV
    head); `out_slices`: the row counts a fused module's output is served as."""
    w, pf = scheme.weights, pack_factor(scheme)
    cols = in_features // tp_size if row_parallel else in_features
    rows = out_features if row_parallel else rows_per_rank or out_features // tp_size
    where = f"{module} ({in_features} inputs, {out_features} outputs"
    where += f", tensor parallel {tp_size})" if tp_size > 1 else ")"
    if row_parallel and in_features % tp_size:
        raise QuantizationError(f"{where}: its inputs do not split {tp_size} ways")
    if w.group_size is not None and cols % w.group_size:
        shard = f"each shard's {cols} inputs" if cols != in_features else "its inputs"
        raise QuantizationError(
            f"{where}: group size {w.group_size} does not divide {shard}; "
            f"{scheme.name} cannot be served this way"
        )
    # GPTQ packs the inputs unpadded; compressed-tensors pads a row's last int32, which
    # only a split of the inputs cannot take.
    inputs_split = row_parallel and tp_size > 1
    packed_in = scheme.format == "gptq" or (scheme.format == "pack-quantized" and inputs_split)
    if pf > 1 and packed_in and cols % pf:
        raise QuantizationError(
            f"{where}: {cols} inputs do not fill whole int32s of {pf} packed values"
        )
    if pf > 1 and packed_along_out(scheme):
        for part in (*(s // (1 if row_parallel else tp_size) for s in out_slices), rows):
            if part % pf:
                raise QuantizationError(
                    f"{where}: {part} output rows do not fill whole int32s of {pf} packed "
                    f"values; {scheme.name} cannot be served this way"
                )


def check_model_shapes(
    scheme: QuantizationScheme, fingerprint: ModelShapes, tp_size: int = 1
) -> None:
    """check_module_shapes for every quantized linear of the model, split `tp_size` ways as
    the engine splits them (KV heads fewer than the ranks are copied, a head per rank)."""
    kv_rows = fingerprint.head_dim * max(fingerprint.kv_heads // tp_size, 1)
    for layer in range(fingerprint.num_layers):
        for module, (in_features, out_features) in fingerprint.modules.items():
            name = fingerprint.module_path(layer, module)
            if not scheme.is_quantized(name):
                continue
            slices = tuple(r for _, r in fingerprint.slices(module))
            check_module_shapes(
                scheme,
                name,
                in_features,
                out_features,
                tp_size,
                row_parallel=module in ROW_PARALLEL,
                rows_per_rank=kv_rows if module in ("k_proj", "v_proj") else None,
                out_slices=slices if len(slices) > 1 else (),
            )
