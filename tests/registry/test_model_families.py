"""`manage.py import_base_model --hf-dir` for every family the engine serves: the stored
fingerprint is the checkpoint's (architecture, dimensions, and the projections an adapter may
target, checked against the weights' own shapes), and a folder the engine would refuse is
refused at import, saying why and naming what is served."""

import json
import shutil

import pytest
from django.core.management import CommandError, call_command
from safetensors import safe_open

from inference.engine.lora.peft_rules import ArchFingerprint
from registry.models import BaseModel
from tests.fresh_python import modules_after
from tests.registry.conftest import targets_of
from tests.tiny_models import FAMILIES

pytestmark = pytest.mark.django_db

ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
}


def checkpoint_linears(folder) -> dict[str, list[int]]:
    """{projection: [in_features, out_features]} of layer 0, read from the weights."""
    found = {}
    for file in folder.glob("*.safetensors"):
        with safe_open(file, framework="numpy") as f:
            names = f.keys()
            for name in names:
                parts = name.split(".")
                if parts[:3] == ["model", "layers", "0"] and parts[-1] == "weight":
                    shape = f.get_slice(name).get_shape()
                    if parts[-2].endswith("_proj") and len(shape) == 2:
                        found[parts[-2]] = [shape[1], shape[0]]
    return found


def test_every_family_of_the_tiny_models_is_covered():
    assert sorted(ARCHITECTURES) == sorted(FAMILIES)


@pytest.mark.parametrize("family", sorted(ARCHITECTURES))
def test_the_command_imports_each_family_with_its_fingerprint(family, family_base_dir, capsys):
    folder = family_base_dir(family)
    call_command("import_base_model", "--hf-dir", str(folder), "--name", f"tiny-{family}")
    assert f"tiny-{family} revision " in capsys.readouterr().out

    row = BaseModel.objects.get(name=f"tiny-{family}")
    config = json.loads((folder / "config.json").read_text())
    fp = row.fingerprint
    assert fp["architecture"] == ARCHITECTURES[family]
    assert fp["num_layers"] == config["num_hidden_layers"] == 2
    assert fp["hidden"] == config["hidden_size"]
    assert fp["heads"] == config["num_attention_heads"]
    assert fp["kv_heads"] == config["num_key_value_heads"]
    assert fp["head_dim"] == (config.get("head_dim") or config["hidden_size"] // fp["heads"])
    assert fp["intermediate"] == config["intermediate_size"]
    assert fp["vocab"] == config["vocab_size"]
    # The projections an adapter may target are the checkpoint's own, in its shapes (Phi-3's
    # fused qkv_proj and gate_up_proj included), not a table assumed from Llama.
    linears = checkpoint_linears(folder)
    assert sorted(linears) == sorted(targets_of(family))
    assert fp["modules"] == linears
    # What the validator reads back from the row is the same fingerprint.
    assert ArchFingerprint.from_dict(fp).to_dict() == fp


def _config_edit(**changes):
    def edit(config: dict) -> dict:
        return {k: v for k, v in (config | changes).items() if v is not DROP}

    return edit


DROP = object()

# (id, family whose folder is edited, edit of its config.json, words the refusal holds)
UNSERVED = [
    ("gemma3_multimodal", "gemma3", _config_edit(architectures=["Gemma3ForConditionalGeneration"]),
     "['Gemma3ForConditionalGeneration'] is not supported"),
    ("mixtral", "mistral", _config_edit(architectures=["MixtralForCausalLM"]),
     "['MixtralForCausalLM'] is not supported"),
    ("no_architectures", "llama", _config_edit(architectures=DROP), "is not supported"),
    ("rope_yarn", "qwen2",
     _config_edit(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}),
     "rope type 'yarn' is not supported"),
    ("sliding_window_zero", "gemma2", _config_edit(sliding_window=0),
     "positive integer sliding_window"),
    ("activation", "llama", _config_edit(hidden_act="relu2"),
     "activation 'relu2' is not supported"),
    ("hidden_size_text", "qwen3", _config_edit(hidden_size="wide"),
     "hidden_size must be a positive integer, got 'wide'"),
    ("kv_heads_do_not_group", "phi3", _config_edit(num_key_value_heads=3), "3 KV heads"),
]  # fmt: skip


@pytest.mark.parametrize("case", UNSERVED, ids=[c[0] for c in UNSERVED])
def test_a_folder_the_engine_would_refuse_is_refused_at_import(case, family_base_dir, tmp_path):
    _, family, edit, words = case
    folder = shutil.copytree(family_base_dir(family), tmp_path / "model")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(edit(config)))
    with pytest.raises(CommandError, match=words.replace("[", r"\[").replace("]", r"\]")):
        call_command("import_base_model", "--hf-dir", str(folder), "--name", "refused")
    assert BaseModel.objects.count() == 0


def test_an_architecture_the_engine_does_not_serve_is_refused_naming_those_it_serves(tmp_path):
    """A real checkpoint of another architecture (GPT-2, made by transformers)."""
    import transformers

    config = transformers.GPT2Config(
        n_layer=1, n_embd=32, n_head=2, vocab_size=64, bos_token_id=0, eos_token_id=0
    )
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(CommandError) as refused:
        call_command("import_base_model", "--hf-dir", str(tmp_path / "gpt2"), "--name", "gpt2")
    message = str(refused.value)
    assert "['GPT2LMHeadModel'] is not supported" in message
    assert "the engine serves" in message
    assert all(arch in message for arch in ARCHITECTURES.values()), message
    assert BaseModel.objects.count() == 0


@pytest.mark.parametrize(
    "text, words",
    [(b"{hidden_size: 64", "config.json is not valid JSON"), (b"[1, 2]", "a JSON object")],
)
def test_a_config_that_is_not_a_json_object_is_refused(text, words, family_base_dir, tmp_path):
    folder = shutil.copytree(family_base_dir("llama"), tmp_path / "model")
    (folder / "config.json").write_bytes(text)
    with pytest.raises(CommandError, match=words):
        call_command("import_base_model", "--hf-dir", str(folder), "--name", "refused")
    assert BaseModel.objects.count() == 0


def test_the_registry_loads_without_torch():
    """The engine's config reader (which imports torch) is imported when a model is, so
    workers that only validate uploads stay light."""
    script = (
        "import django\n"
        "django.setup()\n"
        "import registry.tasks, registry.validation, registry.services.base_models\n"
        "import registry.management.commands.import_base_model\n"
    )
    assert "torch" not in modules_after(script)
