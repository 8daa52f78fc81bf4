"""PEFT adapters made by PEFT itself pass; every kind of adapter the engine cannot apply is
refused."""

import dataclasses
import json
import math
import shutil
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

from inference.engine.formats.safetensors_header import parse_header
from inference.engine.lora.peft_rules import (
    CONFIG_FILE,
    MAX_ADAPTER_HEADER_BYTES,
    MAX_LORA_ALPHA,
    MAX_TARGET_MODULES,
    WEIGHTS_FILE,
    AdapterError,
    ArchFingerprint,
    FingerprintError,
    check_adapter,
    fingerprint_from_config,
    load_adapter_tensors,
    parse_config,
    require_valid,
)
from tests.engine.peft_rule_helpers import (
    ALL_LINEAR,
    ATTENTION,
    KEY,
    MAX_RANK,
    failed,
    make_adapter,
    mutate,
    rename,
    report_for,
    tiny_config,
)
from tests.fresh_python import modules_after

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # PEFT's notes on odd adapters


@pytest.fixture(scope="module")
def fingerprint() -> ArchFingerprint:
    return fingerprint_from_config(tiny_config().to_dict())


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """Rank-4 attention adapter to mutate in the refusal tests."""
    folder = tmp_path_factory.mktemp("good")
    make_adapter(folder, r=4, lora_alpha=8, target_modules=ATTENTION)
    return folder


# ------------------------------------------------------------------ adapters that pass


@pytest.mark.parametrize(
    ("targets", "r", "alpha", "rslora", "modules"),
    [
        (ATTENTION, 4, 8, False, ATTENTION),
        ("all-linear", 8, 16, False, ALL_LINEAR),
        (ATTENTION, 16, 32, True, ATTENTION),
    ],
)
def test_peft_adapter_passes_with_its_rank_scale_and_modules(
    tmp_path, fingerprint, targets, r, alpha, rslora, modules
):
    model = make_adapter(tmp_path, r=r, lora_alpha=alpha, target_modules=targets, use_rslora=rslora)
    report = report_for(tmp_path, fingerprint)
    assert report.ok, report.failures
    spec = require_valid(report)
    assert (spec.rank, spec.lora_alpha, spec.use_rslora) == (r, alpha, rslora)
    assert spec.scale == pytest.approx(alpha / math.sqrt(r) if rslora else alpha / r)
    peft_layer = model.base_model.model.model.layers[0].self_attn.q_proj
    assert spec.scale == pytest.approx(peft_layer.scaling["default"])
    assert spec.target_modules == tuple(modules)
    assert spec.layers == (0, 1)
    assert spec.dtype == "F32"
    assert len(spec.tensor_names) == 2 * 2 * len(modules)
    json.dumps(report.to_dict())


def test_loaded_tensors_equal_peft_module_weights(tmp_path, fingerprint):
    model = make_adapter(tmp_path, r=8, lora_alpha=16, target_modules="all-linear")
    spec, tensors = load_adapter_tensors(tmp_path, fingerprint, max_lora_rank=MAX_RANK)
    assert set(tensors) == {(i, m) for i in range(2) for m in ALL_LINEAR}
    layers = model.base_model.model.model.layers
    for (i, module), (a, b) in tensors.items():
        parent = layers[i].self_attn if module in ATTENTION else layers[i].mlp
        lora = getattr(parent, module)
        assert torch.equal(a, lora.lora_A["default"].weight)
        assert torch.equal(b, lora.lora_B["default"].weight)
        assert a.shape == (8, fingerprint.modules[module][0])
        assert b.shape == (fingerprint.modules[module][1], 8)
    assert spec.rank == 8


def test_adapter_on_some_layers_reports_only_those(tmp_path, fingerprint):
    make_adapter(tmp_path, r=4, lora_alpha=4, target_modules=["v_proj"], layers_to_transform=[1])
    spec = require_valid(report_for(tmp_path, fingerprint))
    assert (spec.layers, spec.target_modules) == ((1,), ("v_proj",))


def test_bf16_adapter_passes(good, tmp_path, fingerprint):
    folder = mutate(good, tmp_path, tensors=lambda w: {k: v.bfloat16() for k, v in w.items()})
    assert require_valid(report_for(folder, fingerprint)).dtype == "BF16"


def test_other_base_model_is_a_warning_not_a_refusal(good, fingerprint):
    report = report_for(good, fingerprint, expected_base_name="meta-llama/Llama-3-8B")
    assert report.ok
    assert "this platform serves 'meta-llama/Llama-3-8B'" in report.warnings[0].message


def test_same_base_model_by_local_path_is_no_warning(good, tmp_path, fingerprint):
    folder = mutate(good, tmp_path, config={"base_model_name_or_path": "/models/Llama-Test/"})
    assert report_for(folder, fingerprint).warnings == []


# ------------------------------------------------------------------ config refusals


@pytest.mark.parametrize(
    ("field", "value", "check", "words"),
    [
        ("peft_type", "LOHA", "peft_type", "only LORA"),
        ("r", None, "r", "positive integer"),
        ("r", "4", "r", "positive integer"),
        ("r", 0, "r", "positive integer"),
        ("lora_alpha", None, "lora_alpha", "positive number"),
        ("lora_alpha", -8, "lora_alpha", "positive number"),
        ("bias", "all", "bias", "bias is 'all'"),
        ("modules_to_save", ["score"], "saved_modules", "only embed_tokens and lm_head"),
        ("fan_in_fan_out", True, "fan_in_fan_out", "fan_in_fan_out"),
        ("layer_replication", [[0, 2], [1, 2]], "layer_replication", "layer_replication"),
        ("trainable_token_indices", [1, 2], "trainable_token_indices", "trainable token"),
        ("lora_bias", True, "lora_bias", "LoRA bias terms"),
    ],
)
def test_unsupported_config_field_is_refused_naming_it(
    good, tmp_path, fingerprint, field, value, check, words
):
    folder = mutate(good, tmp_path, config={field: value})
    assert words in failed(report_for(folder, fingerprint))[check]


def test_rank_above_engine_maximum_is_refused(good, fingerprint):
    message = failed(report_for(good, fingerprint, max_lora_rank=2))["r"]
    assert "r is 4, above this platform's maximum LoRA rank 2" in message


@pytest.mark.parametrize(("raw", "words"), [(b"{nope", "not valid JSON"), (b"[]", "JSON object")])
def test_unreadable_config_is_a_failed_check(good, fingerprint, raw, words):
    header = parse_header(good / WEIGHTS_FILE)
    report = check_adapter(raw, header, fingerprint, max_lora_rank=MAX_RANK)
    assert words in failed(report)["config"]
    with pytest.raises(AdapterError, match=words):
        parse_config(raw)


# ------------------------------------------------------------------ tensor refusals


def test_lora_bias_adapter_is_refused(tmp_path, fingerprint):
    make_adapter(tmp_path, r=4, lora_alpha=8, target_modules=["q_proj"], lora_bias=True)
    failures = failed(report_for(tmp_path, fingerprint))
    assert "lora_bias" in failures["lora_bias"]
    assert "lora_B.bias" in failures["lora_bias_tensors"]


def test_modules_to_save_of_another_module_is_refused(tmp_path, fingerprint):
    make_adapter(tmp_path, r=4, lora_alpha=8, target_modules=["q_proj"], modules_to_save=["norm"])
    message = failed(report_for(tmp_path, fingerprint))["saved_modules"]
    assert "modules_to_save lists 'norm'; only embed_tokens and lm_head" in message
    assert "fully trained model.layers.0.input_layernorm" in message and "and 3 more" in message


def test_tensor_rank_different_from_r_is_refused(good, tmp_path, fingerprint):
    folder = mutate(good, tmp_path, config={"r": 8})
    assert "has rank 4 but r is 8" in failed(report_for(folder, fingerprint))["tensor_rank"]


@pytest.mark.parametrize(
    ("old", "new", "found"),
    [
        ("self_attn.q_proj", "self_attn.qkv_proj", "self_attn.qkv_proj"),
        ("self_attn.k_proj", "mlp.fc1", "mlp.fc1"),
        ("self_attn.v_proj", "mlp.v_proj", "mlp.v_proj"),
    ],
)
def test_module_the_model_lacks_is_refused(good, tmp_path, fingerprint, old, new, found):
    folder = mutate(good, tmp_path, tensors=rename(old, new))
    message = failed(report_for(folder, fingerprint))["modules"]
    assert "has no such module" in message and found in message


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("lora_A.weight", "lora_A.default.weight"),
        ("base_model.model.model.", "model."),
        ("layers.1.", "layers.01."),
    ],
)
def test_key_not_following_peft_naming_is_refused(good, tmp_path, fingerprint, old, new):
    folder = mutate(good, tmp_path, tensors=rename(old, new))
    message = failed(report_for(folder, fingerprint))["tensor_names"]
    assert "names must look like base_model.model.model.layers" in message


def test_lora_a_without_b_is_refused(good, tmp_path, fingerprint):
    dropped = KEY.format(1, "o_proj", "B")
    folder = mutate(good, tmp_path, tensors=lambda w: {k: v for k, v in w.items() if k != dropped})
    message = failed(report_for(folder, fingerprint))["pairs"]
    assert KEY.format(1, "o_proj", "A") + " has no lora_B" in message


def test_shape_that_does_not_fit_the_base_model_is_refused(good, tmp_path, fingerprint):
    name = KEY.format(0, "k_proj", "B")
    folder = mutate(good, tmp_path, tensors=lambda w: w | {name: torch.zeros(64, 4)})
    message = failed(report_for(folder, fingerprint))["shapes"]
    assert f"{name} is [64, 4], the base model needs [32, 4]" in message


def test_adapter_for_a_wider_base_model_is_refused(good, fingerprint):
    wider = fingerprint_from_config(tiny_config(hidden_size=128).to_dict())
    assert "the base model needs" in failed(report_for(good, wider))["shapes"]


def test_layer_index_out_of_range_is_refused(good, tmp_path, fingerprint):
    folder = mutate(good, tmp_path, tensors=rename("layers.1.", "layers.7."))
    message = failed(report_for(folder, fingerprint))["layers"]
    assert "has 2 layers (0-1); found layer 7" in message


def test_non_float_dtype_is_refused(good, tmp_path, fingerprint):
    folder = mutate(good, tmp_path, tensors=lambda w: {k: v.to(torch.int8) for k, v in w.items()})
    assert "found I8" in failed(report_for(folder, fingerprint))["dtype"]


def test_mixed_dtypes_are_refused(good, tmp_path, fingerprint):
    name = KEY.format(0, "q_proj", "A")
    folder = mutate(good, tmp_path, tensors=lambda w: w | {name: w[name].half()})
    assert "mix dtypes F16, F32" in failed(report_for(folder, fingerprint))["dtype"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_non_finite_values_are_refused(good, tmp_path, fingerprint, dtype, value):
    name = KEY.format(1, "v_proj", "B")

    def poison(w):
        w = {k: v.to(dtype) for k, v in w.items()}
        w[name][3, 1] = value
        return w

    folder = mutate(good, tmp_path, tensors=poison)
    message = failed(report_for(folder, fingerprint))["finite"]
    assert "NaN or Inf" in message and name in message
    with pytest.raises(AdapterError, match="NaN or Inf"):
        load_adapter_tensors(folder, fingerprint, max_lora_rank=MAX_RANK)


def test_adapter_with_no_lora_tensors_is_refused(good, tmp_path, fingerprint):
    folder = mutate(good, tmp_path, tensors=lambda w: {})
    message = failed(report_for(folder, fingerprint))["adapts_something"]
    assert "would change nothing" in message


# ------------------------------------------------------------- numbers and names an attacker picks


def with_names(header, rename_to: dict[str, str]):
    """The same header with tensors renamed, as a parser that allowed any name would give."""
    tensors = {rename_to.get(n, n): t for n, t in header.tensors.items()}
    return dataclasses.replace(header, tensors=tensors)


def test_a_five_thousand_digit_layer_index_is_out_of_range_not_an_exception(good, fingerprint):
    header = parse_header(good / WEIGHTS_FILE)
    huge = "9" * 5000
    renamed = {n: n.replace("layers.1.", f"layers.{huge}.") for n in header.tensors}
    config = (good / CONFIG_FILE).read_bytes()
    started = time.perf_counter()
    report = check_adapter(config, with_names(header, renamed), fingerprint, max_lora_rank=MAX_RANK)
    assert time.perf_counter() - started < 0.5
    message = failed(report)["layers"]
    assert "found layer 999999999999" in message and "(5000 digits)" in message
    assert len(message) < 300


def test_a_five_thousand_digit_layer_index_in_a_file_is_refused_by_the_parser(
    good, tmp_path, fingerprint
):
    folder = mutate(good, tmp_path, tensors=rename("layers.1.", f"layers.{'9' * 5000}."))
    with pytest.raises(AdapterError, match="characters; at most 1024"):
        load_adapter_tensors(folder, fingerprint, max_lora_rank=MAX_RANK)


@pytest.mark.parametrize(
    "alpha",
    [10**400, 1e300, MAX_LORA_ALPHA + 1, 0, -8, float("inf"), "8", True, [8]],
    ids=["10**400", "1e300", "max+1", "0", "-8", "inf", "str", "bool", "list"],
)
def test_lora_alpha_outside_a_sane_range_is_refused(good, tmp_path, fingerprint, alpha):
    raw = json.dumps(json.loads((good / CONFIG_FILE).read_text()) | {"lora_alpha": alpha})
    report = check_adapter(
        raw.encode(), parse_header(good / WEIGHTS_FILE), fingerprint, max_lora_rank=MAX_RANK
    )
    message = failed(report)["lora_alpha"]
    assert f"up to {MAX_LORA_ALPHA}" in message and len(message) < 200


def test_lora_alpha_at_the_maximum_passes(good, tmp_path, fingerprint):
    folder = mutate(good, tmp_path, config={"lora_alpha": MAX_LORA_ALPHA})
    report = report_for(folder, fingerprint)
    assert report.ok and report.spec.scale == MAX_LORA_ALPHA / 4


def test_a_config_number_too_long_to_convert_cheaply_is_refused(good, fingerprint):
    raw = b'{"peft_type": "LORA", "r": 4, "lora_alpha": ' + b"9" * 100_000 + b"}"
    started = time.perf_counter()
    report = check_adapter(raw, parse_header(good / WEIGHTS_FILE), fingerprint, max_lora_rank=16)
    assert time.perf_counter() - started < 0.5
    assert "100000-digit number" in failed(report)["config"]
    assert len(failed(report)["config"]) < 200


@pytest.mark.parametrize(
    "field, value",
    [
        ("peft_type", "X" * 100_000),
        ("r", ["x" * 10_000] * 100),
        ("bias", "b" * 100_000),
        ("modules_to_save", ["x" * 10_000 + ".norm", "y" * 10_000]),
        ("rank_pattern", {"x" * 10_000: 99, "(" * 100: 1}),
    ],
)
def test_messages_quote_config_values_briefly(good, tmp_path, fingerprint, field, value):
    folder = mutate(good, tmp_path, config={field: value})
    report = report_for(folder, fingerprint)
    assert not report.ok
    assert all(len(c.message) < 400 for c in report.checks), [len(c.message) for c in report.checks]


def test_target_modules_lists_are_bounded(good, tmp_path, fingerprint):
    targets = [f"model.layers.{i}.self_attn.q_proj" for i in range(MAX_TARGET_MODULES + 1)]
    folder = mutate(good, tmp_path, config={"target_modules": targets})
    message = failed(report_for(folder, fingerprint))["target_modules"]
    assert f"{MAX_TARGET_MODULES + 1} entries; at most {MAX_TARGET_MODULES}" in message


def test_the_adapter_header_is_limited_to_what_an_adapter_needs(good, tmp_path, fingerprint):
    folder = mutate(good, tmp_path)
    weights = load_file(good / WEIGHTS_FILE)
    save_file(weights, folder / WEIGHTS_FILE, metadata={"pad": "x" * MAX_ADAPTER_HEADER_BYTES})
    with pytest.raises(AdapterError, match=f"above the limit of {MAX_ADAPTER_HEADER_BYTES}"):
        load_adapter_tensors(folder, fingerprint, max_lora_rank=MAX_RANK)


# ------------------------------------------------------------------ loader


def test_loader_refuses_an_invalid_adapter_listing_the_failures(good, tmp_path, fingerprint):
    folder = mutate(good, tmp_path, config={"use_dora": True, "r": 8})
    with pytest.raises(
        AdapterError, match=r"dora: .*lora_magnitude_vector per adapted module.*tensor_rank: "
    ):
        load_adapter_tensors(folder, fingerprint, max_lora_rank=MAX_RANK)


@pytest.mark.parametrize("missing", [CONFIG_FILE, WEIGHTS_FILE])
def test_loader_names_a_missing_file(good, tmp_path, fingerprint, missing):
    folder = tmp_path / "partial"
    shutil.copytree(good, folder)
    (folder / missing).unlink()
    with pytest.raises(AdapterError, match=f"{missing} is missing"):
        load_adapter_tensors(folder, fingerprint, max_lora_rank=MAX_RANK)


def test_loader_refuses_a_pickled_checkpoint(good, tmp_path, fingerprint):
    folder = tmp_path / "pickled"
    shutil.copytree(good, folder)
    torch.save(load_file(good / WEIGHTS_FILE), folder / WEIGHTS_FILE)
    with pytest.raises(AdapterError, match="only safetensors is accepted"):
        load_adapter_tensors(folder, fingerprint, max_lora_rank=MAX_RANK)


def test_require_valid_raises_with_the_failed_checks(good, tmp_path, fingerprint):
    folder = mutate(good, tmp_path, config={"peft_type": "IA3"})
    with pytest.raises(AdapterError, match="peft_type: peft_type is 'IA3'"):
        require_valid(report_for(folder, fingerprint))


# ------------------------------------------------------------------ fingerprint


def test_fingerprint_gives_each_module_its_in_and_out_features(fingerprint):
    assert fingerprint.modules == {
        "q_proj": (64, 64),
        "k_proj": (64, 32),
        "v_proj": (64, 32),
        "o_proj": (64, 64),
        "gate_proj": (64, 128),
        "up_proj": (64, 128),
        "down_proj": (128, 64),
    }
    assert (fingerprint.architecture, fingerprint.num_layers, fingerprint.vocab) == (
        "llama",
        2,
        256,
    )


def test_fingerprint_of_smollm2_config_without_head_dim():
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 576,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "intermediate_size": 1536,
        "vocab_size": 49152,
    }
    fp = fingerprint_from_config(cfg)
    assert fp.head_dim == 64 and fp.architecture == "LlamaForCausalLM"
    assert fp.modules["k_proj"] == (576, 192) and fp.modules["down_proj"] == (1536, 576)


def test_fingerprint_with_explicit_head_dim_uses_it():
    fp = fingerprint_from_config(tiny_config(head_dim=32).to_dict())
    assert fp.modules["q_proj"] == (64, 128) and fp.modules["o_proj"] == (128, 64)


def test_fingerprint_round_trips_through_json(fingerprint):
    stored = json.loads(json.dumps(fingerprint.to_dict()))
    assert ArchFingerprint.from_dict(stored) == fingerprint


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"hidden_size": None}, "hidden_size must be a positive integer"),
        ({"num_hidden_layers": "2"}, "num_hidden_layers must be a positive integer"),
        ({"num_key_value_heads": 3}, "do not group into 3 KV heads"),
        ({"head_dim": None, "hidden_size": 66}, "not divisible by 4 heads"),
        ({"architectures": None, "model_type": None}, "neither architectures nor model_type"),
    ],
)
def test_unusable_base_config_is_refused(change, words):
    with pytest.raises(FingerprintError, match=words):
        fingerprint_from_config(tiny_config().to_dict() | change)


def test_tampered_stored_fingerprint_is_refused(fingerprint):
    d = fingerprint.to_dict()
    with pytest.raises(FingerprintError, match="missing"):
        ArchFingerprint.from_dict({k: v for k, v in d.items() if k != "hidden"})
    with pytest.raises(FingerprintError, match="disagree"):
        ArchFingerprint.from_dict(d | {"head_dim": 8})
    with pytest.raises(FingerprintError, match="invalid values"):
        ArchFingerprint.from_dict(d | {"heads": -4})


def test_registry_side_import_pulls_in_neither_torch_nor_django():
    modules = modules_after("import inference.engine.lora.peft_rules")
    assert not modules & {"torch", "django", "safetensors"}
