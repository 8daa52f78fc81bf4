"""The PEFT variants in the upload check (header only, as the registry runs it): per-module
rank and alpha, DoRA, LoRA on embed_tokens / lm_head, whole saved heads, Phi-3's fused
names, and adapters made for another family. Each one PEFT writes passes with the numbers
PEFT uses; every malformed one is refused with a check that names the problem."""

import json
import math
import time

import pytest
import torch
from safetensors.torch import load_file

from inference.engine.formats.safetensors_header import parse_header
from inference.engine.lora.patterns import MAX_PATTERN_ENTRIES, first_match, pattern_problem
from inference.engine.lora.peft_rules import (
    CONFIG_FILE,
    HEAD_LAYER,
    WEIGHTS_FILE,
    ArchFingerprint,
    check_adapter,
    fingerprint_from_config,
    load_adapter,
    require_valid,
)
from tests.engine.peft_rule_helpers import (
    ALL_LINEAR,
    MAX_RANK,
    failed,
    family_model,
    make_adapter,
    mutate,
    report_for,
    tiny_config,
)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::RuntimeWarning")
MAGNITUDE = "base_model.model.model.layers.{}.self_attn.{}.lora_magnitude_vector"


@pytest.fixture(scope="module")
def fingerprint() -> ArchFingerprint:
    return fingerprint_from_config(tiny_config().to_dict())


@pytest.fixture(scope="module")
def dora(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dora")
    make_adapter(folder, r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], use_dora=True)
    return folder


def peft_layers(model):
    """(module path as PEFT names it, LoRA layer) of every adapted module of a PeftModel."""
    return [
        (name.removeprefix("base_model.model."), m)
        for name, m in model.named_modules()
        if isinstance(getattr(m, "scaling", None), dict) and "default" in m.scaling
    ]


# ------------------------------------------------------------------ rank_pattern / alpha_pattern


@pytest.mark.parametrize("rslora", [False, True])
def test_rank_and_alpha_patterns_give_each_module_peft_s_rank_and_scale(
    tmp_path, fingerprint, rslora
):
    model = make_adapter(
        tmp_path,
        r=4,
        lora_alpha=8,
        target_modules="all-linear",
        use_rslora=rslora,
        rank_pattern={"v_proj": 8, r"layers\.1\..*down_proj": 2, "model.layers.0.mlp.up_proj": 16},
        alpha_pattern={"^model.layers.0.*q_proj": 3, "gate_proj": 32},
    )
    spec = require_valid(report_for(tmp_path, fingerprint))
    assert (spec.rank, spec.max_rank, spec.use_rslora) == (4, 16, rslora)
    layers = peft_layers(model)
    assert len(layers) == len(spec.module_scales) == 2 * len(ALL_LINEAR)
    for path, layer in layers:
        index, module = int(path.split(".")[2]), path.rsplit(".", 1)[-1]
        assert spec.module_scales[(index, module)] == pytest.approx(layer.scaling["default"])
        assert layer.lora_A["default"].weight.shape[0] == layer.r["default"]
    scales = {k: v for k, v in spec.module_scales.items()}
    assert scales[(0, "q_proj")] == pytest.approx(3 / math.sqrt(4) if rslora else 3 / 4)
    assert scales[(1, "down_proj")] == pytest.approx(8 / math.sqrt(2) if rslora else 8 / 2)


def test_patterns_match_as_peft_does():
    patterns = {"q_proj": 1, r"layers\.1\..*": 2, "^model.layers.0.*v_proj": 3, "proj": 4}
    assert first_match(patterns, "model.layers.0.self_attn.q_proj") == "q_proj"
    assert first_match(patterns, "model.layers.0.self_attn.v_proj") == "^model.layers.0.*v_proj"
    assert first_match(patterns, "model.layers.1.self_attn.v_proj") == r"layers\.1\..*"
    assert first_match(patterns, "model.layers.2.self_attn.v_proj") is None  # whole components
    assert first_match(patterns, "lm_head") is None
    assert first_match({"up_proj": 1}, "model.layers.0.mlp.gate_up_proj") is None  # whole names


def test_tensor_rank_other_than_its_pattern_rank_is_refused(tmp_path, fingerprint):
    make_adapter(
        tmp_path / "a", r=4, lora_alpha=8, target_modules=["v_proj"], rank_pattern={"v_proj": 8}
    )
    folder = mutate(tmp_path / "a", tmp_path, config={"rank_pattern": {"v_proj": 2}})
    message = failed(report_for(folder, fingerprint))["tensor_rank"]
    assert "has rank 8 but rank_pattern 'v_proj' gives 2" in message


@pytest.mark.parametrize(
    ("pattern", "words"),
    [
        ({"v_proj": 32}, "'v_proj' gets rank 32, above this platform's maximum LoRA rank 16"),
        ({"v_proj": 0}, "'v_proj': a rank must be a positive integer, got 0"),
        ({"v_proj": "8"}, "a rank must be a positive integer, got '8'"),
        ({"(a+)+$": 4}, "repeats a group that holds a quantifier or an alternation"),
        ({"(x|xy)*": 4}, "repeats a group that holds a quantifier or an alternation"),
        ({"(": 4}, "has an unclosed '('"),
        ({"[a-": 4}, "unclosed character class"),
        ({"(?=q)": 4}, "lookaround"),
        ({r"(q)\1": 4}, "backreference"),
        ({".*.*.*.*q": 4}, "4 repeating quantifiers; at most 3"),
        ({"q" * 300: 4}, "is 300 characters long"),
        ({"a{2": 4, "a)": 4}, "unbalanced ')'"),
        ([["v_proj", 8]], "must map module name patterns to numbers"),
        ({f"k{i}": 4 for i in range(MAX_PATTERN_ENTRIES + 1)}, "entries; at most 1024"),
    ],
)
def test_bad_rank_patterns_are_refused(good_llama, tmp_path, fingerprint, pattern, words):
    folder = mutate(good_llama, tmp_path, config={"rank_pattern": pattern})
    message = failed(report_for(folder, fingerprint))["rank_pattern"]
    assert words in message and len(message) < 600


@pytest.mark.parametrize("alpha", [0, -1, 2**16 + 1, "8", None])
def test_bad_alpha_patterns_are_refused(good_llama, tmp_path, fingerprint, alpha):
    folder = mutate(good_llama, tmp_path, config={"alpha_pattern": {"q_proj": alpha}})
    assert (
        "alpha must be a positive number"
        in failed(report_for(folder, fingerprint))["alpha_pattern"]
    )


def test_a_pattern_built_to_backtrack_is_refused_at_once():
    started = time.perf_counter()
    for hostile in ["(a*)*b", "(a|aa)+$", "((ab)*)+c", "(.*a){12}", "(?:x+)+y"]:
        assert pattern_problem(hostile) is not None, hostile
    assert time.perf_counter() - started < 0.05


def test_matching_the_largest_pattern_table_on_a_large_model_is_quick():
    names = [f"model.layers.{i}.self_attn.{m}" for i in range(126) for m in ("q_proj", "v_proj")]
    patterns = {f"model.layers.{i}.mlp.down_proj": 4 for i in range(MAX_PATTERN_ENTRIES - 1)}
    patterns[".*[a-z_]*[a-z_]*q"] = 2
    assert all(pattern_problem(k) is None for k in patterns)
    started = time.perf_counter()
    assert all(first_match(patterns, n) in (None, ".*[a-z_]*[a-z_]*q") for n in names)
    assert time.perf_counter() - started < 2.0


@pytest.fixture(scope="module")
def good_llama(tmp_path_factory):
    folder = tmp_path_factory.mktemp("good-llama")
    make_adapter(folder, r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    return folder


# ------------------------------------------------------------------ DoRA


def test_dora_adapter_passes(dora, fingerprint):
    spec = require_valid(report_for(dora, fingerprint))
    assert spec.use_dora and spec.target_modules == ("q_proj", "v_proj")
    assert sum(1 for k in spec.tensor_names if k[2] == "magnitude") == 2 * 2


def test_dora_adapter_missing_a_magnitude_is_refused(dora, tmp_path, fingerprint):
    dropped = MAGNITUDE.format(1, "v_proj")
    folder = mutate(dora, tmp_path, tensors=lambda w: {k: v for k, v in w.items() if k != dropped})
    message = failed(report_for(folder, fingerprint))["dora"]
    assert (
        "lora_magnitude_vector per adapted module; none for model.layers.1.self_attn.v_proj"
        in message
    )


def test_magnitude_of_the_wrong_length_is_refused(dora, tmp_path, fingerprint):
    name = MAGNITUDE.format(0, "q_proj")
    folder = mutate(dora, tmp_path, tensors=lambda w: w | {name: w[name][:63]})
    message = failed(report_for(folder, fingerprint))["shapes"]
    assert f"{name} has 63 values; the module has 64 outputs" in message


def test_magnitude_that_is_not_a_vector_is_refused(dora, tmp_path, fingerprint):
    name = MAGNITUDE.format(0, "q_proj")
    folder = mutate(dora, tmp_path, tensors=lambda w: w | {name: w[name].view(8, 8)})
    assert (
        f"{name} is [8, 8], a vector was expected"
        in failed(report_for(folder, fingerprint))["dora"]
    )


def test_magnitudes_without_use_dora_are_refused(dora, tmp_path, fingerprint):
    folder = mutate(dora, tmp_path, config={"use_dora": False})
    assert (
        "is a DoRA magnitude but use_dora is not set"
        in failed(report_for(folder, fingerprint))["dora"]
    )


def test_magnitude_without_lora_factors_is_refused(dora, tmp_path, fingerprint):
    pair = ("q_proj.lora_A.weight", "q_proj.lora_B.weight")
    folder = mutate(
        dora, tmp_path, tensors=lambda w: {k: v for k, v in w.items() if not k.endswith(pair)}
    )
    assert "has no LoRA factors to scale" in failed(report_for(folder, fingerprint))["dora"]


# ------------------------------------------------------------------ embed_tokens and lm_head


def test_lora_on_embed_tokens_and_lm_head_passes(tmp_path, fingerprint):
    make_adapter(tmp_path, r=4, lora_alpha=8, target_modules=["embed_tokens", "lm_head", "q_proj"])
    report = report_for(tmp_path, fingerprint)
    spec = require_valid(report)
    assert spec.target_modules == ("q_proj", "embed_tokens", "lm_head")
    assert {(HEAD_LAYER, "embed_tokens"), (HEAD_LAYER, "lm_head")} <= set(spec.module_scales)
    assert spec.saved_modules == ()  # PEFT's base_layer copies are not the adapter's own
    assert report.warnings == []  # the copies are small enough to be compared when loaded


def test_embedding_factor_of_the_wrong_shape_is_refused(tmp_path, fingerprint):
    make_adapter(tmp_path / "a", r=4, lora_alpha=8, target_modules=["embed_tokens"])
    name = "base_model.model.model.embed_tokens.lora_embedding_A"
    folder = mutate(
        tmp_path / "a", tmp_path, tensors=lambda w: w | {name: w[name][:, :255].contiguous()}
    )
    message = failed(report_for(folder, fingerprint))["shapes"]
    assert f"{name} is [4, 255], the base model needs [4, 256]" in message


def test_large_base_layer_copies_are_a_warning_the_engine_checks(tmp_path, fingerprint):
    make_adapter(tmp_path, r=4, lora_alpha=8, target_modules=["embed_tokens"])
    report = report_for(tmp_path, fingerprint, max_saved_params=1000)
    assert report.ok
    [warning] = report.warnings
    assert "must equal the base model's embed_tokens" in warning.message


# ------------------------------------------------------------------ modules_to_save


@pytest.mark.parametrize("module", ["lm_head", "embed_tokens"])
def test_a_saved_head_passes(tmp_path, fingerprint, module):
    make_adapter(tmp_path, r=4, lora_alpha=8, target_modules=["q_proj"], modules_to_save=[module])
    spec = require_valid(report_for(tmp_path, fingerprint))
    assert spec.saved_modules == (module,)


def test_a_tied_saved_embedding_is_saved_for_both_heads(tmp_path, fingerprint):
    make_adapter(
        tmp_path,
        model=family_model_tied(),
        r=4,
        lora_alpha=8,
        target_modules=["q_proj"],
        modules_to_save=["embed_tokens"],
        ensure_weight_tying=True,
    )
    assert require_valid(report_for(tmp_path, fingerprint)).saved_modules == (
        "embed_tokens",
        "lm_head",
    )


def family_model_tied():
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM(tiny_config(tie_word_embeddings=True))


def test_a_saved_head_above_the_size_limit_is_refused(tmp_path, fingerprint):
    make_adapter(
        tmp_path, r=4, lora_alpha=8, target_modules=["q_proj"], modules_to_save=["lm_head"]
    )
    message = failed(report_for(tmp_path, fingerprint, max_saved_params=1000))["saved_modules"]
    assert "own lm_head has 16,384 parameters, above this platform's limit of 1,000" in message
    assert "LORAPLEX_MAX_SAVED_MODULE_PARAMS" in message


def test_the_size_limit_defaults_to_what_a_small_head_needs(tmp_path, fingerprint):
    make_adapter(
        tmp_path, r=4, lora_alpha=8, target_modules=["q_proj"], modules_to_save=["lm_head"]
    )
    assert report_for(tmp_path, fingerprint).ok  # 16,384 parameters, far below 2**25
    assert report_for(tmp_path, fingerprint, max_saved_params=16384).ok
    assert (
        "above this platform's limit"
        in failed(report_for(tmp_path, fingerprint, max_saved_params=16383))["saved_modules"]
    )


def test_a_saved_head_of_the_wrong_shape_is_refused(tmp_path, fingerprint):
    make_adapter(
        tmp_path / "a", r=4, lora_alpha=8, target_modules=["q_proj"], modules_to_save=["lm_head"]
    )
    name = "base_model.model.lm_head.weight"
    folder = mutate(tmp_path / "a", tmp_path, tensors=lambda w: w | {name: torch.zeros(257, 64)})
    message = failed(report_for(folder, fingerprint))["saved_modules"]
    assert f"{name} is [257, 64], the base model's is [256, 64]" in message


def test_modules_to_save_naming_a_head_the_file_lacks_is_refused(good_llama, tmp_path, fingerprint):
    folder = mutate(good_llama, tmp_path, config={"modules_to_save": ["lm_head"]})
    message = failed(report_for(folder, fingerprint))["saved_modules"]
    assert "modules_to_save names lm_head but the file holds no copy of it" in message


def test_a_saved_layer_module_is_refused(good_llama, tmp_path, fingerprint):
    name = "base_model.model.model.layers.0.mlp.down_proj.weight"
    folder = mutate(good_llama, tmp_path, tensors=lambda w: w | {name: torch.zeros(64, 128)})
    message = failed(report_for(folder, fingerprint))["saved_modules"]
    assert "the file holds fully trained model.layers.0.mlp.down_proj" in message


# ------------------------------------------------------------------ Phi-3's fused modules


@pytest.fixture(scope="module")
def phi3():
    return family_model("phi3")


def test_phi3_fingerprint_names_the_fused_modules(phi3):
    _, fp = phi3
    assert fp.architecture == "Phi3ForCausalLM"
    assert fp.modules == {
        "qkv_proj": (128, 128 + 2 * 32),  # 8 query heads, 2 KV heads of 16
        "o_proj": (128, 128),
        "gate_up_proj": (128, 2 * 96),
        "down_proj": (96, 128),
    }
    assert fp.slices("qkv_proj") == [("q_proj", 128), ("k_proj", 32), ("v_proj", 32)]
    assert ArchFingerprint.from_dict(json.loads(json.dumps(fp.to_dict()))) == fp


def test_phi3_adapter_is_split_into_the_engine_s_slices(phi3, tmp_path):
    model, fp = phi3
    peft_model = make_adapter(
        tmp_path,
        model=model,
        r=4,
        lora_alpha=8,
        target_modules="all-linear",
        use_dora=True,
        rank_pattern={"gate_up_proj": 8},
    )
    spec, tensors = load_adapter(tmp_path, fp, max_lora_rank=MAX_RANK)
    assert spec.target_modules == ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
    layer = peft_model.base_model.model.model.layers[1]
    qkv, gate_up = layer.self_attn.qkv_proj, layer.mlp.gate_up_proj
    a, b = qkv.lora_A["default"].weight, qkv.lora_B["default"].weight
    m = qkv.lora_magnitude_vector["default"].weight
    rows = {"q_proj": slice(0, 128), "k_proj": slice(128, 160), "v_proj": slice(160, 192)}
    for piece, part in rows.items():
        got_a, got_b = tensors.factors[(1, piece)]
        assert torch.equal(got_a, a) and torch.equal(got_b, b[part])
        assert torch.equal(tensors.magnitudes[(1, piece)], m[part])
        assert tensors.scales[(1, piece)] == pytest.approx(qkv.scaling["default"])
    up_a, up_b = tensors.factors[(1, "up_proj")]
    assert up_a.shape == (8, 128) and torch.equal(up_b, gate_up.lora_B["default"].weight[96:])
    assert tensors.scales[(1, "up_proj")] == pytest.approx(gate_up.scaling["default"])


# ------------------------------------------------------------------ another family's adapter


@pytest.fixture(scope="module")
def family_adapters(tmp_path_factory):
    """A q/v (or fused qkv) adapter for each family's tiny model, and its fingerprint."""
    made = {}
    for family in ("llama", "qwen2", "phi3"):
        model, fp = family_model(family)
        folder = tmp_path_factory.mktemp(family)
        targets = ["qkv_proj", "gate_up_proj"] if family == "phi3" else ["q_proj", "v_proj"]
        make_adapter(folder, model=model, r=4, lora_alpha=8, target_modules=targets)
        config = json.loads((folder / CONFIG_FILE).read_text())
        config["base_model_name_or_path"] = f"org/tiny-{family}"
        (folder / CONFIG_FILE).write_text(json.dumps(config))
        made[family] = (folder, fp)
    return made


def cross_report(family_adapters, adapter_family, base_family):
    folder, _ = family_adapters[adapter_family]
    _, fp = family_adapters[base_family]
    return report_for(folder, fp, expected_base_name=None)


@pytest.mark.parametrize("family", ["llama", "qwen2", "phi3"])
def test_each_family_s_adapter_fits_its_own_base(family_adapters, family):
    report = cross_report(family_adapters, family, family)
    assert report.ok, report.failures
    assert {c.name: c.message for c in report.checks}["architecture"].startswith("fits ")


@pytest.mark.parametrize(
    ("adapter", "base", "words"),
    [
        ("qwen2", "llama", ["shapes imply hidden size 96 (the base LlamaForCausalLM has 64)"]),
        ("llama", "qwen2", ["shapes imply hidden size 64 (the base Qwen2ForCausalLM has 96)"]),
        (
            "phi3",
            "llama",
            ["hidden size 128", "it names gate_up_proj, qkv_proj, which LlamaForCausalLM lacks"],
        ),
        (
            "llama",
            "phi3",
            ["it names q_proj, v_proj, which Phi3ForCausalLM has fused into qkv_proj"],
        ),
        ("qwen2", "phi3", ["hidden size 96 (the base Phi3ForCausalLM has 128)"]),
    ],
)
def test_another_family_s_adapter_is_refused_naming_the_mismatch(
    family_adapters, adapter, base, words
):
    message = failed(cross_report(family_adapters, adapter, base))["architecture"]
    assert message.startswith("this adapter was made for another model than the base ")
    for w in words:
        assert w in message
    assert f"it says it was trained on 'org/tiny-{adapter}'" in message


def test_a_recorded_base_class_of_another_family_is_refused_even_when_shapes_fit(tmp_path):
    """PEFT records the base class when task_type is unset: a Mistral adapter of a Llama's
    exact shapes still names the mismatch."""
    fp = fingerprint_from_config(tiny_config().to_dict() | {"architectures": ["LlamaForCausalLM"]})
    make_adapter(tmp_path, r=4, lora_alpha=8, target_modules=["q_proj"])
    config = json.loads((tmp_path / CONFIG_FILE).read_text())
    config["auto_mapping"] = {"base_model_class": "MistralForCausalLM", "parent_library": "x"}
    (tmp_path / CONFIG_FILE).write_text(json.dumps(config))
    message = failed(report_for(tmp_path, fp))["architecture"]
    assert "PEFT recorded its base as a 'MistralForCausalLM'" in message


def test_a_stored_llama_fingerprint_row_is_still_read():
    """A fingerprint the registry stored before fused modules existed."""
    stored = {
        "architecture": "LlamaForCausalLM",
        "num_layers": 30,
        "hidden": 576,
        "heads": 9,
        "kv_heads": 3,
        "head_dim": 64,
        "intermediate": 1536,
        "vocab": 49152,
        "modules": {
            "q_proj": [576, 576],
            "k_proj": [576, 192],
            "v_proj": [576, 192],
            "o_proj": [576, 576],
            "gate_proj": [576, 1536],
            "up_proj": [576, 1536],
            "down_proj": [1536, 576],
        },
    }
    fp = ArchFingerprint.from_dict(stored)
    assert not fp.fused and fp.to_dict() == stored


def test_header_only_check_reads_no_tensor(dora, fingerprint):
    """The registry's path: config and header, no weights file values."""
    header = parse_header(dora / WEIGHTS_FILE)
    report = check_adapter(
        (dora / CONFIG_FILE).read_bytes(), header, fingerprint, max_lora_rank=MAX_RANK
    )
    assert report.ok and "finite" not in {c.name for c in report.checks}
    assert set(load_file(dora / WEIGHTS_FILE)) == set(header.tensors)
