"""config.json's quantization_config, as llmcompressor, AutoAWQ and GPTQ write it: read into
one QuantizationScheme, or refused with the reason; and the shapes a scheme can be served at
(groups tiling the inputs, packed ints whole on every tensor-parallel rank)."""

import copy
import json

import pytest

from inference.engine.config import ModelConfig
from inference.engine.errors import ConfigError, ModelLoadError
from inference.engine.fingerprint import ArchFingerprint, fingerprint_from_config
from inference.engine.parallel.plan import check_shardable
from inference.engine.quantization import (
    QuantizationError,
    QuantizationScheme,
    check_module_shapes,
    parse_quantization,
)
from inference.engine.quantization.tensors import check_checkpoint_tensors, expected_tensors
from tests.quantized.configs import FP8_DYNAMIC, TOKEN_FP8, compressed_config, quant_args

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "num_hidden_layers": 2,
    "vocab_size": 384,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 512,
    "torch_dtype": "bfloat16",
}


FP8_STATIC = compressed_config(
    "float-quantized",
    quant_args(type="float", strategy="tensor"),
    input_activations=quant_args(type="float", strategy="tensor", observer="static_minmax"),
)
W4A16 = compressed_config(
    "pack-quantized", quant_args(num_bits=4, strategy="group", group_size=128)
)
W4A16_ASYM = compressed_config(
    "pack-quantized", quant_args(num_bits=4, strategy="group", group_size=128, symmetric=False)
)
W4A16_ACTORDER = compressed_config(
    "pack-quantized", quant_args(num_bits=4, strategy="group", group_size=64, actorder="group")
)
W8A16_CHANNEL = compressed_config("pack-quantized", quant_args(num_bits=8, strategy="channel"))
W8A16_G128 = compressed_config(
    "pack-quantized", quant_args(num_bits=8, strategy="group", group_size=128)
)
AWQ = {  # AutoAWQ's save_quantized, as transformers' AwqConfig keeps it
    "bits": 4,
    "group_size": 128,
    "modules_to_not_convert": None,
    "quant_method": "awq",
    "version": "gemm",
    "zero_point": True,
}
GPTQ = {  # AutoGPTQ / GPTQModel, v1 checkpoint format
    "bits": 4,
    "checkpoint_format": "gptq",
    "damp_percent": 0.01,
    "desc_act": True,
    "group_size": 128,
    "model_file_base_name": None,
    "model_name_or_path": None,
    "quant_method": "gptq",
    "static_groups": False,
    "sym": True,
    "true_sequential": True,
}


def scheme_of(qc, base=LLAMA) -> QuantizationScheme:
    scheme = parse_quantization(base | {"quantization_config": copy.deepcopy(qc)})
    assert scheme is not None
    return scheme


@pytest.mark.parametrize(
    "qc, name",
    [
        (FP8_DYNAMIC, "fp8-dynamic"),
        (FP8_STATIC, "fp8-static-tensor"),
        (W4A16, "w4a16-g128"),
        (W4A16_ASYM, "w4a16-g128-asym"),
        (W4A16_ACTORDER, "w4a16-g64-actorder"),
        (W8A16_CHANNEL, "w8a16-channel"),
        (W8A16_G128, "w8a16-g128"),
        (AWQ, "awq-w4-g128"),
        (GPTQ, "gptq-w4-g128-actorder"),
        (GPTQ | {"desc_act": False, "sym": False, "group_size": -1}, "gptq-w4-channel-asym"),
    ],
)
def test_each_served_scheme_reads_with_its_name(qc, name):
    scheme = scheme_of(qc)
    assert scheme.name == name
    assert not scheme.is_quantized("lm_head")
    assert scheme.is_quantized("model.layers.1.mlp.down_proj")
    assert QuantizationScheme.from_canonical(scheme.canonical()) == scheme


def test_the_fields_a_loader_reads():
    fp8 = scheme_of(FP8_DYNAMIC)
    assert (fp8.format, fp8.weights.type, fp8.weights.bits) == ("float-quantized", "float", 8)
    assert (fp8.weights.granularity, fp8.weights.group_size) == ("channel", None)
    assert fp8.activations is not None and fp8.activations.dynamic
    assert fp8.activations.granularity == "token"
    static = scheme_of(FP8_STATIC).activations
    assert static is not None and not static.dynamic and static.granularity == "tensor"
    w4 = scheme_of(W4A16_ASYM)
    assert w4.weight_only and w4.weights.group_size == 128 and not w4.weights.symmetric
    assert scheme_of(W4A16_ACTORDER).weights.actorder
    # "weight" actorder reorders calibration only: the layout has no g_idx
    assert not scheme_of(W4A16).weights.actorder
    weight_order = copy.deepcopy(W4A16)
    weight_order["config_groups"]["group_0"]["weights"]["actorder"] = "weight"
    assert not scheme_of(weight_order).weights.actorder
    awq = scheme_of(AWQ)
    assert (awq.format, awq.weights.symmetric) == ("awq-gemm", False)


def test_the_engine_config_reads_the_scheme_from_the_folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA | {"quantization_config": AWQ}))
    scheme = ModelConfig.from_folder(tmp_path).quantization
    assert scheme is not None and scheme.name == "awq-w4-g128"


def test_an_unquantized_config_has_no_scheme():
    assert parse_quantization(LLAMA) is None
    assert ModelConfig.from_dict(LLAMA).quantization is None


def test_ignored_modules_stay_unquantized():
    qc = copy.deepcopy(W4A16) | {"ignore": ["lm_head", "re:.*self_attn.*"]}
    scheme = scheme_of(qc)
    assert not scheme.is_quantized("model.layers.0.self_attn.q_proj")
    assert scheme.is_quantized("model.layers.0.mlp.up_proj")
    awq = scheme_of(AWQ | {"modules_to_not_convert": ["gate_proj"]})
    assert not awq.is_quantized("model.layers.0.mlp.gate_proj")
    assert awq.is_quantized("model.layers.0.mlp.up_proj")


def test_config_groups_of_one_scheme_merge_their_targets():
    qc = copy.deepcopy(W4A16)
    group = qc["config_groups"].pop("group_0")
    qc["config_groups"] = {
        "attention": group | {"targets": ["re:.*self_attn.*"]},
        "mlp": group | {"targets": ["re:.*mlp.*"]},
    }
    scheme = scheme_of(qc)
    assert scheme.targets == ("re:.*mlp.*", "re:.*self_attn.*")
    assert scheme.is_quantized("model.layers.0.mlp.down_proj")
    assert QuantizationScheme.from_canonical(scheme.canonical()) == scheme


def _edit(qc, path, value):
    qc = copy.deepcopy(qc)
    *parents, last = path.split(".")
    node = qc
    for key in parents:
        node = node[key]
    node[last] = value
    return qc


WEIGHTS = "config_groups.group_0.weights"
ACTS = "config_groups.group_0.input_activations"


@pytest.mark.parametrize(
    "qc, words",
    [
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "'bitsandbytes' is not served"),
        (W4A16 | {"config_groups": {}}, "no config_groups"),
        (
            _edit(_edit(W4A16, "format", "int-quantized"), "config_groups.group_0.format", None),
            "format 'int-quantized' is not served",
        ),
        (_edit(W4A16, f"{WEIGHTS}.num_bits", 3), "3-bit int weights are not served"),
        (_edit(W4A16, f"{WEIGHTS}.group_size", 96), "group size 96 is not served"),
        (_edit(W4A16, f"{WEIGHTS}.strategy", "block"), "block-wise scales are not served"),
        (_edit(W4A16, ACTS, TOKEN_FP8 | {"type": "int"}), "8-bit int activations"),
        (_edit(W4A16, ACTS, TOKEN_FP8), "W4A8"),
        (_edit(FP8_DYNAMIC, f"{ACTS}.strategy", "group"), "strategy 'group' and dynamic True"),
        (_edit(FP8_DYNAMIC, f"{ACTS}.dynamic", False), "dynamic per-token or static per-tensor"),
        (_edit(FP8_DYNAMIC, f"{WEIGHTS}.type", "int"), "float-quantized holds FP8 weights"),
        (_edit(FP8_DYNAMIC, "kv_cache_scheme", quant_args(type="float")), "KV-cache quantization"),
        (_edit(W4A16, "sparsity_config", {"format": "sparse-24-bitmask"}), "sparsity"),
        (_edit(W4A16, "quantization_status", "frozen"), "save_compressed=True"),
        (_edit(W4A16, "ignore", []), "quantizes lm_head"),
        (
            _edit(W4A16, "config_groups.group_1", FP8_DYNAMIC["config_groups"]["group_0"]),
            "mixes schemes across config_groups (group_0: w4a16-g128; group_1: fp8-dynamic)",
        ),
        (AWQ | {"version": "gemv"}, "AWQ version 'gemv' is not served"),
        (AWQ | {"bits": 8}, "8-bit AWQ"),
        (GPTQ | {"bits": 3}, "3-bit GPTQ"),
        (GPTQ | {"checkpoint_format": "gptq_v2"}, "checkpoint_format 'gptq_v2'"),
        (GPTQ | {"group_size": 96}, "group size 96 is not served"),
        (GPTQ | {"lm_head": True}, "quantizes lm_head"),
    ],
)
def test_what_the_engine_cannot_serve_is_refused_with_the_reason(qc, words):
    with pytest.raises(QuantizationError) as info:
        parse_quantization(LLAMA | {"quantization_config": qc}, source="m/config.json")
    assert words in str(info.value)
    assert str(info.value).startswith("m/config.json: quantization_config")
    # the engine's own config refuses it the same way, as a model it cannot load
    with pytest.raises(ModelLoadError, match="quantization_config"):
        ModelConfig.from_dict(LLAMA | {"quantization_config": qc})


def test_a_group_size_that_does_not_divide_the_inputs_is_refused():
    odd = LLAMA | {"intermediate_size": 320}  # down_proj's 320 inputs are not groups of 128
    with pytest.raises(QuantizationError, match="group size 128 does not divide its inputs"):
        fingerprint_from_config(odd | {"quantization_config": W4A16})
    fingerprint_from_config(
        odd | {"quantization_config": _edit(W4A16, f"{WEIGHTS}.group_size", 64)}
    )


def test_groups_and_packed_ints_must_not_straddle_tensor_parallel_ranks():
    scheme = scheme_of(W4A16)
    check_module_shapes(scheme, "down_proj", 256, 128, 2, row_parallel=True)
    with pytest.raises(QuantizationError, match="each shard's 64 inputs"):
        check_module_shapes(scheme, "down_proj", 256, 128, 4, row_parallel=True)
    check_module_shapes(scheme, "up_proj", 128, 256, 4)  # rows split; groups stay whole
    awq = scheme_of(AWQ)
    with pytest.raises(QuantizationError, match="4 output rows do not fill whole int32s of 8"):
        check_module_shapes(awq, "k_proj", 128, 8, 2)
    # the engine refuses such a size at start, before any weight loads
    fp = fingerprint_from_config(LLAMA | {"quantization_config": W4A16})
    mc = ModelConfig.from_dict(LLAMA | {"quantization_config": W4A16})
    assert mc.fingerprint == fp and mc.quantization == fp.quantization
    check_shardable(mc, 2)
    with pytest.raises(ConfigError, match="tensor_parallel_size 4: .*each shard's 64 inputs"):
        check_shardable(mc, 4)


def test_the_fingerprint_holds_the_scheme_and_differs_from_the_float_base():
    plain = fingerprint_from_config(LLAMA)
    fp8 = fingerprint_from_config(LLAMA | {"quantization_config": FP8_DYNAMIC})
    assert plain.modules == fp8.modules  # an adapter's tensors fit both
    assert plain != fp8 and plain.to_dict() != fp8.to_dict()
    assert "quantization" not in plain.to_dict()  # stored float fingerprints are unchanged
    assert fp8.to_dict()["quantization"]["name"] == "fp8-dynamic"
    assert ArchFingerprint.from_dict(fp8.to_dict()) == fp8
    assert ArchFingerprint.from_dict(plain.to_dict()) == plain
    w4 = fingerprint_from_config(LLAMA | {"quantization_config": W4A16})
    assert len({plain, fp8, w4}) == 3


def _header(scheme, fp, **override):
    """The (dtype, shape) of every tensor a correct checkpoint of `scheme` holds."""
    tensors = {}
    for layer in range(fp.num_layers):
        for module, (n_in, n_out) in fp.modules.items():
            for want in expected_tensors(scheme, n_in, n_out):
                name = f"{fp.module_path(layer, module)}.{want.suffix}"
                tensors[name] = (want.dtypes[0], want.shapes[0])
    return tensors | override


@pytest.mark.parametrize("qc", [FP8_DYNAMIC, FP8_STATIC, W4A16_ASYM, W4A16_ACTORDER, AWQ, GPTQ])
def test_a_checkpoint_of_the_declared_layout_passes(qc):
    fp = fingerprint_from_config(LLAMA | {"quantization_config": qc})
    check_checkpoint_tensors(fp.quantization, fp, _header(fp.quantization, fp))


def test_scales_of_the_wrong_shape_are_refused_naming_the_tensor():
    fp = fingerprint_from_config(LLAMA | {"quantization_config": W4A16})
    name = "model.layers.0.mlp.down_proj.weight_scale"
    assert expected_tensors(fp.quantization, 256, 128)[2].shapes == ((128, 2),)
    with pytest.raises(QuantizationError, match=rf"'{name}' has shape \[128, 4\]"):
        check_checkpoint_tensors(
            fp.quantization, fp, _header(fp.quantization, fp, **{name: ("BF16", (128, 4))})
        )
    packed = "model.layers.1.self_attn.q_proj.weight_packed"
    with pytest.raises(QuantizationError, match=f"'{packed}' is F16; w4a16-g128 stores I32"):
        check_checkpoint_tensors(
            fp.quantization, fp, _header(fp.quantization, fp, **{packed: ("F16", (256, 16))})
        )
    dense = {k: v for k, v in _header(fp.quantization, fp).items() if "weight_packed" not in k}
    with pytest.raises(QuantizationError, match="no tensor 'model.layers.0.self_attn.q_proj"):
        check_checkpoint_tensors(fp.quantization, fp, dense)
