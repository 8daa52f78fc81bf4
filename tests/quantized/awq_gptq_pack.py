"""AutoAWQ (GEMM) and GPTQ (v1) checkpoints written by our own packer, with its inverse.

Neither AutoAWQ nor a GPTQ library installs beside our torch, so the tests make such folders
here, from the formats as their documentation and loaders describe them:

- Both quantize the transposed weight, `[in, out]`, in groups of `group_size` input rows,
  with fp16 `scales [in/group, out]` and integer zero points; a weight is
  `(q - zero) * scale`, with q and zero unsigned 4-bit values.
- AWQ GEMM: `qweight [in, out/8]` int32 packs 8 neighbouring output columns per word, in the
  interleaved order [0, 2, 4, 6, 1, 3, 5, 7] (nibble i, from the low bits up, holds column
  ORDER[i] of its block of 8); `qzeros [in/group, out/8]` packs the zero points the same way.
- GPTQ: `qweight [in/8, out]` packs 8 consecutive input rows per word, in order;
  `qzeros [in/group, out/8]` packs output columns in order and stores zero - 1 (the v1
  checkpoint convention: loaders add the 1 back, so a symmetric 4-bit group stores 7 for 8);
  `g_idx [in]` int32 gives each input row its group, which with `desc_act` follows the order
  the quantizer visited the rows in (largest activations first), not the row order.

Each folder gets a sibling `<name>-dequantized` with the same model in fp32 holding exactly
the dequantized weights: transformers loads it as a plain model, the reference for an engine
that serves the packed one.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

BITS = 4
PACK = 32 // BITS  # values per int32
MAXQ = (1 << BITS) - 1
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
WEIGHTS = "model.safetensors"


@dataclass
class Quantized:
    """One linear layer's 4-bit weight, unpacked: `q [in, out]`, `zeros`/`scales`
    `[groups, out]`, `g_idx [in]`."""

    q: torch.Tensor
    zeros: torch.Tensor
    scales: torch.Tensor
    g_idx: torch.Tensor

    def dequantize(self) -> torch.Tensor:
        """The weight as the model uses it, `[out, in]` fp32."""
        rows = self.g_idx.long()
        zeros = self.zeros[rows].float()
        return ((self.q.float() - zeros) * self.scales[rows].float()).T.contiguous()


def quantize(
    weight: torch.Tensor,
    group_size: int,
    *,
    symmetric: bool,
    row_order: torch.Tensor | None = None,
) -> Quantized:
    """Round-to-nearest 4-bit quantization of `weight [out, in]` in groups of input rows.

    `row_order` (a permutation of the input rows) makes the groups follow that order, as
    GPTQ's `desc_act` does; by default groups are consecutive rows."""
    w = weight.detach().float().T  # [in, out]
    rows = w.shape[0]
    if rows % group_size:
        raise ValueError(f"{rows} input rows do not divide into groups of {group_size}")
    order = torch.arange(rows) if row_order is None else row_order
    g_idx = torch.empty(rows, dtype=torch.int32)
    g_idx[order] = (torch.arange(rows) // group_size).to(torch.int32)
    groups = rows // group_size
    scales = torch.empty(groups, w.shape[1], dtype=torch.float16)
    zeros = torch.empty(groups, w.shape[1], dtype=torch.int32)
    q = torch.empty_like(w, dtype=torch.int32)
    for group in range(groups):
        members = g_idx == group
        block = w[members]
        if symmetric:
            zero = torch.full((w.shape[1],), (MAXQ + 1) // 2, dtype=torch.int32)
            scale = (block.abs().amax(0) * 2 / MAXQ).clamp_min(1e-8).half()
        else:
            low = block.amin(0).clamp(max=0)
            high = block.amax(0).clamp(min=0)
            scale = ((high - low) / MAXQ).clamp_min(1e-8).half()
            zero = torch.round(-low / scale.float()).clamp(0, MAXQ).to(torch.int32)
        scales[group], zeros[group] = scale, zero
        q[members] = torch.round(block / scale.float() + zero).clamp(0, MAXQ).to(torch.int32)
    return Quantized(q, zeros, scales, g_idx)


def _to_int32(words: torch.Tensor) -> torch.Tensor:
    """Unsigned 32-bit words (held in int64) as the int32 the formats store."""
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)


def _pack_columns(values: torch.Tensor, order: tuple[int, ...]) -> torch.Tensor:
    """Pack `[rows, cols]` 4-bit values into `[rows, cols/8]` words, nibble i holding
    column order[i] of each block of 8."""
    rows, cols = values.shape
    blocks = values.long().reshape(rows, cols // PACK, PACK)
    words = torch.zeros(rows, cols // PACK, dtype=torch.int64)
    for nibble, column in enumerate(order):
        words |= (blocks[:, :, column] & MAXQ) << (BITS * nibble)
    return _to_int32(words)


def _unpack_columns(words: torch.Tensor, order: tuple[int, ...]) -> torch.Tensor:
    rows, packed = words.shape
    unsigned = words.long() & 0xFFFFFFFF
    values = torch.empty(rows, packed, PACK, dtype=torch.int32)
    for nibble, column in enumerate(order):
        values[:, :, column] = ((unsigned >> (BITS * nibble)) & MAXQ).to(torch.int32)
    return values.reshape(rows, packed * PACK)


SEQUENTIAL = tuple(range(PACK))


def pack_awq(quantized: Quantized) -> dict[str, torch.Tensor]:
    if not torch.equal(quantized.g_idx, torch.sort(quantized.g_idx).values):
        raise ValueError("AWQ's format has no g_idx: its groups are consecutive rows")
    return {
        "qweight": _pack_columns(quantized.q, AWQ_ORDER),
        "qzeros": _pack_columns(quantized.zeros, AWQ_ORDER),
        "scales": quantized.scales,
    }


def unpack_awq(tensors: dict[str, torch.Tensor], group_size: int) -> Quantized:
    q = _unpack_columns(tensors["qweight"], AWQ_ORDER)
    g_idx = (torch.arange(q.shape[0]) // group_size).to(torch.int32)
    zeros = _unpack_columns(tensors["qzeros"], AWQ_ORDER)
    return Quantized(q, zeros, tensors["scales"], g_idx)


def pack_gptq(quantized: Quantized) -> dict[str, torch.Tensor]:
    # rows go into words 8 at a time: pack the transpose by columns
    qweight = _pack_columns(quantized.q.T.contiguous(), SEQUENTIAL).T.contiguous()
    stored_zeros = (quantized.zeros - 1) & MAXQ
    return {
        "qweight": qweight,
        "qzeros": _pack_columns(stored_zeros, SEQUENTIAL),
        "scales": quantized.scales,
        "g_idx": quantized.g_idx,
    }


def unpack_gptq(tensors: dict[str, torch.Tensor]) -> Quantized:
    q = _unpack_columns(tensors["qweight"].T.contiguous(), SEQUENTIAL).T.contiguous()
    zeros = (_unpack_columns(tensors["qzeros"], SEQUENTIAL) + 1) & MAXQ
    return Quantized(q, zeros, tensors["scales"], tensors["g_idx"])


def _is_quantized_linear(name: str) -> bool:
    # the decoder layers' projections; embeddings, norms and lm_head stay in fp16
    return ".layers." in name and name.endswith("_proj.weight")


def quantization_config(fmt: str, group_size: int, desc_act: bool = False) -> dict[str, Any]:
    if fmt == "awq":
        return {
            "quant_method": "awq",
            "bits": BITS,
            "group_size": group_size,
            "zero_point": True,
            "version": "gemm",
            "modules_to_not_convert": None,
        }
    return {
        "quant_method": "gptq",
        "bits": BITS,
        "group_size": group_size,
        "desc_act": desc_act,
        "sym": True,
        "damp_percent": 0.01,
        "true_sequential": True,
        "static_groups": False,
        "checkpoint_format": "gptq",
    }


def write_packed(
    base_dir: str | Path,
    out_dir: str | Path,
    fmt: str,
    *,
    group_size: int = 128,
    desc_act: bool = False,
    seed: int = 0,
) -> tuple[Path, Path]:
    """Write `out_dir` (the base model in `fmt`, "awq" or "gptq") and its fp32 reference
    `<out_dir>-dequantized`; returns both paths.

    With `desc_act` the rows of each layer are grouped in a seeded random order, standing in
    for the activation order a calibrated GPTQ run would find."""
    base_dir, out_dir = Path(base_dir), Path(out_dir)
    reference_dir = out_dir.with_name(out_dir.name + "-dequantized")
    if fmt == "awq" and desc_act:
        raise ValueError("AWQ has no desc_act")
    generator = torch.Generator().manual_seed(seed)
    packed: dict[str, torch.Tensor] = {}
    reference: dict[str, torch.Tensor] = {}
    for name, tensor in load_file(str(base_dir / WEIGHTS)).items():
        if not _is_quantized_linear(name):
            packed[name] = tensor.half()
            reference[name] = tensor.half().float()
            continue
        order = torch.randperm(tensor.shape[1], generator=generator) if desc_act else None
        layer = quantize(tensor, group_size, symmetric=fmt == "gptq", row_order=order)
        prefix = name.removesuffix(".weight")
        parts = pack_awq(layer) if fmt == "awq" else pack_gptq(layer)
        packed.update({f"{prefix}.{part}": value for part, value in parts.items()})
        reference[name] = layer.dequantize()
    config = json.loads((base_dir / "config.json").read_text())
    written_sets = ((out_dir, packed, "float16"), (reference_dir, reference, "float32"))
    for folder, tensors, dtype in written_sets:
        folder.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(folder / WEIGHTS), metadata={"format": "pt"})
        written = {**config, "dtype": dtype}
        if folder == out_dir:
            written["quantization_config"] = quantization_config(fmt, group_size, desc_act)
        (folder / "config.json").write_text(json.dumps(written, indent=2))
        for file in TOKENIZER_FILES:
            shutil.copy(base_dir / file, folder / file)
    return out_dir, reference_dir


def read_packed(folder: str | Path) -> dict[str, Quantized]:
    """Every quantized layer of a folder written by `write_packed`, unpacked."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())["quantization_config"]
    tensors = load_file(str(folder / WEIGHTS))
    layers: dict[str, Quantized] = {}
    for name in tensors:
        if not name.endswith(".qweight"):
            continue
        prefix = name.removesuffix(".qweight")
        parts = {k.rsplit(".", 1)[1]: v for k, v in tensors.items() if k.startswith(prefix + ".")}
        if config["quant_method"] == "awq":
            layers[prefix] = unpack_awq(parts, config["group_size"])
        else:
            layers[prefix] = unpack_gptq(parts)
    return layers
