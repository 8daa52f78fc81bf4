"""compressed-tensors' on-disk layout, read back by hand: what a checkpoint folder must hold,
and its weights dequantized without the library.

The tests hold llmcompressor's output to this, and transformers' own decompression to the
dequantized weights, so the layout an engine has to read is written down and checked:

- `float-quantized`: `weight` float8_e4m3fn `[out, in]`, `weight_scale` `[out, 1]` per
  channel or `[1]` per tensor; static activations add `input_scale` `[1]`.
- `pack-quantized`: `weight_packed` int32 `[out, in * bits / 32]`, each word holding
  32 / bits consecutive input columns from the low bits up, stored with an offset of
  2^(bits-1) (so unsigned); `weight_shape` int64 `[out, in]`; `weight_scale` `[out, groups]`
  (groups = 1 per channel); asymmetric schemes add `weight_zero_point` int32
  `[out * bits / 32, groups]`, packed the same way along the output dimension.
- A weight is `(q - zero_point) * scale`, groups running along the input dimension.
  transformers computes it in the scales' dtype, so a bf16 checkpoint decompresses to bf16
  values even when loaded in fp32: an fp32 engine matches it by rounding the same way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

WEIGHTS = "model.safetensors"


def quantization_config(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "config.json").read_text())["quantization_config"]


def weight_args(folder: Path) -> dict[str, Any]:
    (group,) = quantization_config(folder)["config_groups"].values()
    return group["weights"]


def unpack_rows(words: torch.Tensor, bits: int) -> torch.Tensor:
    """`[rows, n]` int32 words -> `[rows, n * 32 / bits]` signed values."""
    per_word = 32 // bits
    unsigned = words.long() & 0xFFFFFFFF
    shifts = torch.arange(per_word) * bits
    values = (unsigned.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    return values.reshape(words.shape[0], -1) - (1 << (bits - 1))


def dequantize_layer(tensors: dict[str, torch.Tensor], prefix: str, args: dict[str, Any],
                     fmt: str) -> torch.Tensor:  # fmt: skip
    """The `[out, in]` fp32 weight of layer `prefix`, from its tensors alone."""
    scale = tensors[f"{prefix}.weight_scale"].float()
    if fmt == "float-quantized":
        return tensors[f"{prefix}.weight"].float() * scale
    out, inp = tensors[f"{prefix}.weight_shape"].tolist()
    bits = args["num_bits"]
    q = unpack_rows(tensors[f"{prefix}.weight_packed"], bits)[:, :inp].float()
    zero_name = f"{prefix}.weight_zero_point"
    if zero_name in tensors:
        zero = unpack_rows(tensors[zero_name].T.contiguous(), bits).T[:out].float()
    else:
        zero = torch.zeros_like(scale)
    columns = torch.arange(inp) // (inp // scale.shape[1])
    return (q - zero[:, columns]) * scale[:, columns]


def load_decompressed(folder: Path) -> Any:
    """transformers' model of a compressed-tensors folder with its weights decompressed, in
    fp32: the weight-only reference (left compressed, FP8 schemes also quantize activations,
    and asymmetric pack-quantized folders do not load at all with transformers 5.24)."""
    import warnings

    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    config = CompressedTensorsConfig(run_compressed=False)
    with warnings.catch_warnings():  # "the folder's own quantization_config will be used"
        warnings.simplefilter("ignore", UserWarning)
        model = AutoModelForCausalLM.from_pretrained(
            str(folder), dtype=torch.float32, quantization_config=config
        )
    return model.eval()


def dequantize_folder(folder: Path) -> dict[str, torch.Tensor]:
    """Every quantized layer's weight, by layer name (`model.layers.0.self_attn.q_proj`)."""
    tensors = load_file(str(folder / WEIGHTS))
    fmt = quantization_config(folder)["format"]
    args = weight_args(folder)
    return {
        name.removesuffix(".weight_scale"): dequantize_layer(
            tensors, name.removesuffix(".weight_scale"), args, fmt
        )
        for name in tensors
        if name.endswith(".weight_scale")
    }
