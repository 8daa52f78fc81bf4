"""A quantized checkpoint whose tensors disagree with its config.json is refused when the
engine loads it, naming the tensor; the packing the loader converts to is the kernels'."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from inference.engine import EngineRequest, LLMEngine, SamplingParams
from inference.engine.errors import ModelLoadError
from inference.engine.model.layers import Linear
from inference.engine.model.quantized_formats import pack_int32
from inference.kernels.quant_ref import unpack_int32
from tests.engine.stepping import step_logits
from tests.quantized.compressed_format import dequantize_folder

LAYER = "model.layers.1.mlp.down_proj"


def _edited(src: Path, dst: Path, edit) -> Path:
    shutil.copytree(src, dst)
    weights = dst / "model.safetensors"
    tensors = load_file(str(weights))
    edit(tensors)
    save_file(tensors, str(weights), metadata={"format": "pt"})
    return dst


def test_a_missing_scale_is_refused_by_name(compressed_checkpoints, tmp_path):
    folder = _edited(
        compressed_checkpoints.folders["llama-w4a16"],
        tmp_path / "no-scale",
        lambda t: t.pop(f"{LAYER}.weight_scale"),
    )
    with pytest.raises(ModelLoadError, match=f"'{LAYER}.weight_scale'"):
        LLMEngine(model=folder, kv_cache_bytes=1 << 20)


def test_scales_of_the_wrong_shape_are_refused(compressed_checkpoints, tmp_path):
    def halve(tensors):
        scale = tensors[f"{LAYER}.weight_scale"]
        tensors[f"{LAYER}.weight_scale"] = scale[: scale.shape[0] // 2].contiguous()

    folder = _edited(compressed_checkpoints.folders["llama-w8a16"], tmp_path / "bad", halve)
    with pytest.raises(ModelLoadError, match=f"'{LAYER}'.*scales of shape"):
        LLMEngine(model=folder, kv_cache_bytes=1 << 20)


def test_a_tensor_the_format_does_not_store_is_refused(packed_checkpoints, tmp_path):
    def add(tensors):
        tensors[f"{LAYER}.weight_packed"] = torch.zeros(128, 32, dtype=torch.int32)

    folder = _edited(packed_checkpoints.folders["llama-awq-gemm-g128"], tmp_path / "extra", add)
    with pytest.raises(ModelLoadError, match="weight_packed' is not one awq-w4-g128 stores"):
        LLMEngine(model=folder, kv_cache_bytes=1 << 20)


@pytest.mark.parametrize("bits", [4, 8])
def test_packing_is_the_inverse_of_the_kernels_unpacking(bits):
    values = torch.randint(0, 1 << bits, (6, 40), dtype=torch.int32)
    packed = pack_int32(values, bits)
    assert packed.dtype == torch.int32 and packed.shape == (6, -(-40 * bits // 32))
    assert torch.equal(unpack_int32(packed, bits, 40), values)


@pytest.mark.parametrize("name", ["llama-w4a16-g32-asym", "llama-fp8-static"])
def test_the_weight_dora_reads_is_the_dequantized_checkpoint(compressed_checkpoints, name):
    """DoRA's magnitude scales need the base weight: a quantized layer dequantizes it on
    access (the same values its GEMM uses) instead of keeping a dense copy."""
    folder = compressed_checkpoints.folders[name]
    engine = LLMEngine(model=folder, kv_cache_bytes=1 << 20)
    expected = dequantize_folder(folder)
    layer = engine.model_runner.model.model.layers[1].mlp.gate_up_proj
    assert layer.weight.shape == (512, 128)
    up = layer.weight[layer.output_slice(1)]
    torch.testing.assert_close(up, expected["model.layers.1.mlp.up_proj"], atol=1e-6, rtol=0)


def _logits(engine: LLMEngine, ids: list[int]) -> torch.Tensor:
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    engine.add_request(EngineRequest("r", prompt_token_ids=ids, sampling_params=params))
    [(_, row)] = step_logits(engine)
    engine.abort("r")
    engine.step()
    return row


def test_a_layer_split_over_two_files_loads_the_same(compressed_checkpoints, tmp_path):
    """Each layer is converted once its last tensor is read, whichever file holds it."""
    source = compressed_checkpoints.folders["llama-w4a16-asym"]
    split = tmp_path / "split"
    shutil.copytree(source, split)
    tensors = load_file(str(split / "model.safetensors"))
    (split / "model.safetensors").unlink()
    names = sorted(tensors)
    for i in range(2):
        part = {n: tensors[n] for n in names[i::2]}
        save_file(part, str(split / f"model-0000{i + 1}-of-00002.safetensors"))
    ids = [5, 17, 42, 99, 7]
    whole = _logits(LLMEngine(model=source, kv_cache_bytes=1 << 20), ids)
    torch.testing.assert_close(
        _logits(LLMEngine(model=split, kv_cache_bytes=1 << 20), ids), whole, atol=0, rtol=0
    )


def test_ignored_layers_stay_in_the_compute_dtype(compressed_checkpoints, tmp_path):
    """A module the scheme ignores is a plain Linear, loaded from its dense weight."""
    source = compressed_checkpoints.folders["llama-w8a16"]
    folder = tmp_path / "ignore-down"
    shutil.copytree(source, folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"]["ignore"].append("re:.*down_proj$")
    (folder / "config.json").write_text(json.dumps(config))
    tensors = load_file(str(folder / "model.safetensors"))
    dense = dequantize_folder(source)
    for layer in (0, 1):
        prefix = f"model.layers.{layer}.mlp.down_proj"
        for suffix in ("weight_packed", "weight_scale", "weight_shape"):
            tensors.pop(f"{prefix}.{suffix}")
        tensors[f"{prefix}.weight"] = dense[prefix]
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    mixed = LLMEngine(model=folder, kv_cache_bytes=1 << 20)
    down = mixed.model_runner.model.model.layers[0].mlp.down_proj
    assert type(down) is Linear and down.weight.dtype == torch.float32
    ids = [5, 17, 42, 99, 7]
    quantized = _logits(LLMEngine(model=source, kv_cache_bytes=1 << 20), ids)
    torch.testing.assert_close(_logits(mixed, ids), quantized, atol=1e-5, rtol=0)
