"""The quantized fixture checkpoints are what their formats say, and transformers reads the
compressed-tensors ones back: the references the engine's quantized parity tests compare to.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.quantized import awq_gptq_pack, compressed_format
from tests.quantized.checkpoints import PACKED

# name -> (format, bits, weight strategy, group size, symmetric, activations (strategy,
# dynamic) or None); written from the scheme names, not read from the recipes
EXPECTED: dict[str, tuple[str, int, str, int | None, bool, tuple[str, bool] | None]] = {
    "llama-fp8-dynamic": ("float-quantized", 8, "channel", None, True, ("token", True)),
    "llama-fp8-static": ("float-quantized", 8, "tensor", None, True, ("tensor", False)),
    "llama-w4a16": ("pack-quantized", 4, "group", 128, True, None),
    "llama-w4a16-asym": ("pack-quantized", 4, "group", 128, False, None),
    "llama-w8a16": ("pack-quantized", 8, "group", 128, True, None),
    "llama-w4a16-channel": ("pack-quantized", 4, "channel", None, True, None),
    "llama-w4a16-g32-asym": ("pack-quantized", 4, "group", 32, False, None),
    "llama-w8a16-g64-asym": ("pack-quantized", 8, "group", 64, False, None),
    "llama-w4a16-gptq-actorder": ("pack-quantized", 4, "group", 128, True, None),
    "qwen2-fp8-dynamic": ("float-quantized", 8, "channel", None, True, ("token", True)),
    "qwen2-w4a16-g64": ("pack-quantized", 4, "group", 64, True, None),
    "qwen2-w4a16-g64-asym": ("pack-quantized", 4, "group", 64, False, None),
}
PROMPT = torch.tensor([[1, 17, 33, 90, 200, 7, 8, 300, 42, 5, 120, 2]])
LAYERS = 2
PROJECTIONS = 7  # q, k, v, o, gate, up, down


def _linear_shapes(base: Path) -> dict[str, tuple[int, ...]]:
    return {
        name.removesuffix(".weight"): tuple(t.shape)
        for name, t in load_file(str(base / "model.safetensors")).items()
        if ".layers." in name and name.endswith("_proj.weight")
    }


def _logits(folder: Path, **kwargs) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, **kwargs)
    with torch.no_grad():
        return model.eval()(PROMPT).logits[0]


def _relative_error(logits: torch.Tensor, reference: torch.Tensor) -> float:
    return ((logits - reference).norm() / reference.norm()).item()


def test_every_scheme_was_made(compressed_checkpoints):
    assert set(compressed_checkpoints.folders) == set(EXPECTED)
    for folder in compressed_checkpoints.folders.values():
        assert (folder / "tokenizer.json").is_file()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_config_names_the_scheme(compressed_checkpoints, name):
    fmt, bits, strategy, group_size, symmetric, activations = EXPECTED[name]
    config = compressed_format.quantization_config(compressed_checkpoints.folders[name])
    assert config["quant_method"] == "compressed-tensors"
    assert config["format"] == fmt
    assert config["ignore"] == ["lm_head"]
    (group,) = config["config_groups"].values()
    assert group["targets"] == ["Linear"]
    weights = group["weights"]
    assert (weights["num_bits"], weights["strategy"], weights["group_size"]) == (
        bits,
        strategy,
        group_size,
    )
    assert weights["symmetric"] is symmetric
    assert weights["type"] == ("float" if fmt == "float-quantized" else "int")
    assert weights["actorder"] == ("weight" if "actorder" in name else None)
    if activations is None:
        assert group["input_activations"] is None
    else:
        inputs = group["input_activations"]
        assert (inputs["strategy"], inputs["dynamic"], inputs["num_bits"]) == (*activations, 8)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_tensors_have_the_format_layout(compressed_checkpoints, name):
    fmt, bits, strategy, group_size, symmetric, activations = EXPECTED[name]
    folder = compressed_checkpoints.folders[name]
    family = compressed_checkpoints.manifest[name]["family"]
    dtype = getattr(torch, compressed_checkpoints.manifest[name]["dtype"])
    base = load_file(str(compressed_checkpoints.bases[family] / "model.safetensors"))
    shapes = _linear_shapes(compressed_checkpoints.bases[family])
    assert len(shapes) == LAYERS * PROJECTIONS
    tensors = load_file(str(folder / "model.safetensors"))
    assert tensors["lm_head.weight"].dtype == dtype
    assert tensors["model.embed_tokens.weight"].dtype == dtype
    assert not [k for k in tensors if k.startswith("lm_head.") and k != "lm_head.weight"]
    for prefix, (out, inp) in shapes.items():
        names = {k.removeprefix(prefix + ".") for k in tensors if k.startswith(prefix + ".")}
        if f"{prefix}.bias" in base:  # Qwen2's q/k/v biases stay as they were
            assert tensors[f"{prefix}.bias"].dtype == dtype
            names.remove("bias")
        scale = tensors[f"{prefix}.weight_scale"]
        assert scale.dtype == dtype
        groups = 1 if group_size is None else inp // group_size
        if fmt == "float-quantized":
            static = activations == ("tensor", False)
            assert names == {"weight", "weight_scale"} | ({"input_scale"} if static else set())
            assert tensors[f"{prefix}.weight"].dtype == torch.float8_e4m3fn
            assert tuple(tensors[f"{prefix}.weight"].shape) == (out, inp)
            assert tuple(scale.shape) == ((1,) if strategy == "tensor" else (out, 1))
            if static:
                assert tuple(tensors[f"{prefix}.input_scale"].shape) == (1,)
            continue
        expected = {"weight_packed", "weight_scale", "weight_shape"}
        assert names == (expected if symmetric else expected | {"weight_zero_point"}), prefix
        packed = tensors[f"{prefix}.weight_packed"]
        assert (packed.dtype, tuple(packed.shape)) == (torch.int32, (out, inp * bits // 32))
        assert tensors[f"{prefix}.weight_shape"].tolist() == [out, inp]
        assert tuple(scale.shape) == (out, groups)
        if not symmetric:
            zero = tensors[f"{prefix}.weight_zero_point"]
            assert (zero.dtype, tuple(zero.shape)) == (torch.int32, (out * bits // 32, groups))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_transformers_decompresses_to_our_reading(compressed_checkpoints, name):
    """Our reading of the layout (compressed_format.py) gives transformers' decompressed
    weights bit for bit, once rounded to the checkpoint's dtype (transformers multiplies in
    it: a bf16 checkpoint's weights come out rounded to bf16 even when loaded in fp32)."""
    folder = compressed_checkpoints.folders[name]
    dtype = getattr(torch, compressed_checkpoints.manifest[name]["dtype"])
    ours = compressed_format.dequantize_folder(folder)
    theirs = dict(compressed_format.load_decompressed(folder).named_parameters())
    assert len(ours) == LAYERS * PROJECTIONS
    for prefix, weight in ours.items():
        assert torch.equal(weight.to(dtype).float(), theirs[f"{prefix}.weight"]), prefix


@pytest.mark.parametrize("name", sorted(n for n in EXPECTED if "gptq" not in n))
def test_round_to_nearest_stays_within_half_a_step(compressed_checkpoints, name):
    """Data-free quantization rounds each weight to its nearest level (GPTQ, which moves
    weights to compensate for earlier errors, is left out)."""
    fmt = EXPECTED[name][0]
    manifest = compressed_checkpoints.manifest[name]
    base = load_file(str(compressed_checkpoints.bases[manifest["family"]] / "model.safetensors"))
    source_dtype = getattr(torch, manifest["dtype"])
    tensors = load_file(str(compressed_checkpoints.folders[name] / "model.safetensors"))
    for prefix, weight in compressed_format.dequantize_folder(
        compressed_checkpoints.folders[name]
    ).items():
        original = base[f"{prefix}.weight"].to(source_dtype).float()
        scale = tensors[f"{prefix}.weight_scale"].float()
        if fmt == "float-quantized":  # e4m3: 3 mantissa bits, subnormals below 2^-6
            bound = original.abs() * 2**-4 + scale * 2**-9
        else:
            # half a step; a bf16 quantizer's rounded scales and arithmetic add up to 0.1
            steps = scale.repeat_interleave(original.shape[1] // scale.shape[1], dim=1)
            bound = steps * (0.5 if source_dtype == torch.float32 else 0.6)
        assert ((weight - original).abs() <= bound * 1.001 + 1e-7).all(), prefix


# relative L2 error of the decompressed model's logits against the fp32 base: random tiny
# weights quantize badly (measured: fp8 0.09, 4-bit 0.29-0.45, 8-bit 0.02), so these only
# say "the same model, quantized"
LOGIT_ERROR = {"float-quantized": 0.15, 4: 0.6, 8: 0.05}
# FP8 run compressed (activations quantized too) against decompressed (measured 0.08-0.13)
ACTIVATION_ERROR = 0.2


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_decompressed_logits_are_near_the_base(compressed_checkpoints, name):
    fmt, bits = EXPECTED[name][:2]
    family = compressed_checkpoints.manifest[name]["family"]
    reference = _logits(compressed_checkpoints.bases[family])
    with torch.no_grad():
        logits = compressed_format.load_decompressed(compressed_checkpoints.folders[name])(
            PROMPT
        ).logits[0]
    bound = LOGIT_ERROR[fmt] if fmt == "float-quantized" else LOGIT_ERROR[bits]
    assert 0 < _relative_error(logits, reference) < bound


@pytest.mark.parametrize("name", ["llama-fp8-dynamic", "llama-fp8-static"])
def test_fp8_runs_compressed_with_activation_quantization(compressed_checkpoints, name):
    """Left compressed, transformers also quantizes the activations (per token, or with the
    static scale), which moves the logits off the weight-only decompressed ones. (Left
    compressed, an asymmetric pack-quantized folder does not load at all: transformers 5.24
    expects its zero points unpacked.)"""
    folder = compressed_checkpoints.folders[name]
    compressed = _logits(folder)
    with torch.no_grad():
        weight_only = compressed_format.load_decompressed(folder)(PROMPT).logits[0]
    assert 0 < _relative_error(compressed, weight_only) < ACTIVATION_ERROR


@pytest.mark.parametrize("name", ["llama-w4a16", "qwen2-fp8-dynamic"])
def test_adapter_applies_on_the_quantized_model(compressed_checkpoints, packed_checkpoints,
                                               name):  # fmt: skip
    from peft import PeftModel

    family = compressed_checkpoints.manifest[name]["family"]
    model = compressed_format.load_decompressed(compressed_checkpoints.folders[name])
    with torch.no_grad():
        plain = model(PROMPT).logits[0]
        adapted = PeftModel.from_pretrained(model, str(packed_checkpoints.adapters[family]))
        with_adapter = adapted(PROMPT).logits[0]
    loaded = [n for n, _ in adapted.named_parameters() if "lora_B" in n]
    assert len(loaded) == LAYERS * PROJECTIONS
    assert _relative_error(with_adapter, plain) > 0.01


# -- AutoAWQ and GPTQ, from our packer


def test_awq_interleaves_and_gptq_keeps_the_order():
    """Columns 0..7 holding their own index pack into one word whose nibbles, from the low
    bits up, read 0 2 4 6 1 3 5 7 for AWQ and 0..7 for GPTQ's zero points (minus one)."""
    values = torch.arange(8, dtype=torch.int32).repeat(8, 1)
    layer = awq_gptq_pack.Quantized(
        q=values, zeros=values[:1] + 1, scales=torch.ones(1, 8).half(), g_idx=torch.zeros(8).int()
    )
    assert awq_gptq_pack.pack_awq(layer)["qweight"].tolist() == [[0x75316420]] * 8
    assert awq_gptq_pack.pack_gptq(layer)["qzeros"].tolist() == [[0x76543210]]
    # GPTQ packs 8 input rows per word; all 15 sets the sign bit of the int32
    rows = torch.full((8, 8), 15, dtype=torch.int32)
    tall = awq_gptq_pack.Quantized(rows, rows[:1], torch.ones(1, 8).half(), torch.zeros(8).int())
    assert awq_gptq_pack.pack_gptq(tall)["qweight"].tolist() == [[-1] * 8]


@pytest.mark.parametrize("name", sorted(PACKED))
def test_packed_layout(packed_checkpoints, name):
    fmt, desc_act = PACKED[name]
    folder = packed_checkpoints.folders[name]
    config = json.loads((folder / "config.json").read_text())["quantization_config"]
    assert config == awq_gptq_pack.quantization_config(fmt, 128, desc_act)
    assert (config["quant_method"], config["bits"], config["group_size"]) == (fmt, 4, 128)
    tensors = load_file(str(folder / "model.safetensors"))
    shapes = _linear_shapes(packed_checkpoints.bases["llama"])
    assert tensors["lm_head.weight"].dtype == torch.float16
    for prefix, (out, inp) in shapes.items():
        names = {k.removeprefix(prefix + ".") for k in tensors if k.startswith(prefix + ".")}
        qweight, qzeros = tensors[f"{prefix}.qweight"], tensors[f"{prefix}.qzeros"]
        scales = tensors[f"{prefix}.scales"]
        assert (qweight.dtype, qzeros.dtype) == (torch.int32, torch.int32)
        assert scales.dtype == torch.float16
        assert tuple(qzeros.shape) == (inp // 128, out // 8)
        assert tuple(scales.shape) == (inp // 128, out)
        if fmt == "awq":
            assert names == {"qweight", "qzeros", "scales"}
            assert tuple(qweight.shape) == (inp, out // 8)
            continue
        assert names == {"qweight", "qzeros", "scales", "g_idx"}
        assert tuple(qweight.shape) == (inp // 8, out)
        assert (qzeros == 0x77777777).all()  # symmetric: zero 8, stored as 7
        g_idx = tensors[f"{prefix}.g_idx"]
        assert g_idx.dtype == torch.int32
        assert torch.bincount(g_idx).tolist() == [128] * (inp // 128)
        in_order = torch.equal(g_idx, torch.arange(inp, dtype=torch.int32) // 128)
        assert in_order is (not desc_act or inp == 128)  # one group has but one order


@pytest.mark.parametrize("name", sorted(PACKED))
def test_packing_round_trips(packed_checkpoints, name):
    fmt, _ = PACKED[name]
    folder = packed_checkpoints.folders[name]
    tensors = load_file(str(folder / "model.safetensors"))
    reference = load_file(str(packed_checkpoints.references[name] / "model.safetensors"))
    base = load_file(str(packed_checkpoints.bases["llama"] / "model.safetensors"))
    layers = awq_gptq_pack.read_packed(folder)
    assert len(layers) == LAYERS * PROJECTIONS
    for prefix, layer in layers.items():
        repacked = awq_gptq_pack.pack_awq(layer) if fmt == "awq" else awq_gptq_pack.pack_gptq(layer)
        for part, value in repacked.items():
            assert torch.equal(value, tensors[f"{prefix}.{part}"]), (prefix, part)
        weight = layer.dequantize()
        assert torch.equal(weight, reference[f"{prefix}.weight"])
        steps = layer.scales.float()[layer.g_idx.long()].T
        # asymmetric zero points are rounded too: up to a whole step at a group's ends; fp16
        # scales, rounded down, add up to 7.5 steps times 2^-11
        bound = steps * (0.51 if fmt == "gptq" else 1.01)
        assert ((weight - base[f"{prefix}.weight"]).abs() <= bound).all(), prefix
    for name_, tensor in reference.items():
        if not name_.endswith("_proj.weight"):
            assert torch.equal(tensor, tensors[name_].float())


@pytest.mark.parametrize("name", sorted(PACKED))
def test_dequantized_reference_logits_are_near_the_base(packed_checkpoints, name):
    reference = _logits(packed_checkpoints.bases["llama"])
    logits = _logits(packed_checkpoints.references[name])
    assert 0 < _relative_error(logits, reference) < LOGIT_ERROR[4]
