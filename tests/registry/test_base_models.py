"""Base models: import (command and service), revisions, and the compatibility re-check that
keeps adapters off a base they were not trained for."""

import json
import shutil

import pytest
from django.core.management import CommandError, call_command

from audit.models import AuditEvent
from registry.errors import NotServable
from registry.models import BaseModel
from registry.selectors import adapter_version_resolve
from registry.services.aliases import alias_set
from registry.services.base_models import base_model_import, base_model_recheck, model_revision
from tests.registry.conftest import (
    ALICE_ACTOR,
    BASE_NAME,
    attach_eval_set,
    make_ready_version,
    run_evaluations,
)
from tests.tiny_llama import make_tiny_llama

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def retrained_base_dir(tmp_path_factory):
    """Same architecture as the tiny base, other weights: a new revision adapters still fit."""
    return make_tiny_llama(tmp_path_factory.mktemp("retrained"), seed=1)


@pytest.fixture(scope="module")
def shallower_base_dir(tmp_path_factory):
    """One layer instead of two: adapters on layer 1 no longer fit."""
    return make_tiny_llama(tmp_path_factory.mktemp("shallow"), num_layers=1)


def test_the_revision_covers_config_and_every_weight_byte(tiny_base_dir, tmp_path):
    copy = shutil.copytree(tiny_base_dir, tmp_path / "copy")
    assert model_revision(copy) == model_revision(tiny_base_dir)
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert model_revision(copy) != model_revision(tiny_base_dir)
    config = json.loads((tiny_base_dir / "config.json").read_text())
    (copy / "model.safetensors").write_bytes((tiny_base_dir / "model.safetensors").read_bytes())
    (copy / "config.json").write_text(json.dumps(config | {"rms_norm_eps": 1e-3}))
    assert model_revision(copy) != model_revision(tiny_base_dir)


def test_the_command_imports_a_hugging_face_folder(tiny_base_dir, capsys):
    call_command("import_base_model", "--hf-dir", str(tiny_base_dir), "--name", "tiny-llama")
    row = BaseModel.objects.get()
    assert row.is_default and row.local_path == str(tiny_base_dir.resolve())
    assert row.fingerprint["heads"] == 4 and row.fingerprint["kv_heads"] == 2
    assert "imported, the default base model" in capsys.readouterr().out
    call_command(
        "import_base_model", "--hf-dir", str(tiny_base_dir), "--name", "second", "--no-default"
    )
    assert list(BaseModel.objects.filter(is_default=True).values_list("name", flat=True)) == [
        "tiny-llama"
    ]
    call_command(
        "import_base_model", "--hf-dir", str(tiny_base_dir), "--name", "second", "--default"
    )
    assert list(BaseModel.objects.filter(is_default=True).values_list("name", flat=True)) == [
        "second"
    ]


@pytest.mark.parametrize(
    "args, words",
    [
        (["--hf-dir", "/nonexistent"], "--name is required"),
        (["--hf-dir", "/nonexistent", "--name", "x"], "is not a folder"),
        (["--hf-dir", "{tmp}", "--name", "x"], "no config.json"),
        (["--hf-dir", "{bin_only}", "--name", "x"], "no .safetensors weights"),
        (["--hf-dir", "{tmp}", "--name", "../escape"], "--name:"),
    ],
)
def test_the_command_refuses_bad_input_with_a_reason(args, words, tmp_path, tiny_base_dir):
    bin_only = tmp_path / "bin-only"
    bin_only.mkdir()
    shutil.copy(tiny_base_dir / "config.json", bin_only / "config.json")
    (bin_only / "pytorch_model.bin").write_bytes(b"\x80\x02}q\x00.")
    args = [a.format(tmp=tmp_path, bin_only=bin_only) for a in args]
    with pytest.raises(CommandError, match=words.replace(".", r"\.")):
        call_command("import_base_model", *args)
    assert BaseModel.objects.count() == 0


def test_a_new_revision_is_not_served_until_rechecked_and_reevaluated(
    tenant_a, adapter, good_adapter_dir, retrained_base_dir, scorer
):
    attach_eval_set(adapter)
    version = make_ready_version(adapter, good_adapter_dir)
    run_evaluations()
    alias_set(adapter=adapter, name="production", version_number=1, actor=ALICE_ACTOR)
    base, changed = base_model_import(name=BASE_NAME, path=retrained_base_dir)
    assert changed and base.is_default
    with pytest.raises(NotServable, match="not been checked"):
        adapter_version_resolve(tenant=tenant_a, adapter_name="support-bot")

    assert base_model_recheck(base_model_id=base.pk) == {"compatible": 1, "incompatible": 0}
    version.refresh_from_db()
    assert version.checked_revision == base.revision and version.compatible is True
    with pytest.raises(NotServable, match="evaluation pending on revision"):
        adapter_version_resolve(tenant=tenant_a, adapter_name="support-bot")
    run_evaluations()  # the same perplexity on the new weights: passed
    assert adapter_version_resolve(tenant=tenant_a, adapter_name="support-bot").pk == version.pk
    assert AuditEvent.objects.get(verb="version.compatible").actor == "system:compatibility"
    assert base_model_recheck(base_model_id=base.pk) == {"compatible": 0, "incompatible": 0}


def test_an_incompatible_new_revision_is_recorded_and_cannot_be_promoted(
    tenant_a, adapter, good_adapter_dir, shallower_base_dir, user_client, alice
):
    version = make_ready_version(adapter, good_adapter_dir)
    base, _ = base_model_import(name=BASE_NAME, path=shallower_base_dir)
    assert base_model_recheck(base_model_id=base.pk) == {"compatible": 0, "incompatible": 1}
    version.refresh_from_db()
    assert version.status == "ready" and version.compatible is False
    assert (
        "layers: the base model has 1 layers (0-0); found layer 1" in version.compatibility_detail
    )
    event = AuditEvent.objects.get(verb="version.incompatible")
    assert event.before["compatible"] is True and event.after["compatible"] is False
    response = user_client(alice).put(
        "/api/v1/adapters/support-bot/aliases/production/", {"version": 1}, format="json"
    )
    assert response.status_code == 409
    assert "found layer 1" in response.json()["error"]["message"]
    with pytest.raises(NotServable, match="does not fit"):
        adapter_version_resolve(tenant=tenant_a, adapter_name="support-bot", number=1)


def test_reimporting_the_same_weights_changes_nothing(tiny_base_dir, base_model):
    again, changed = base_model_import(name=BASE_NAME, path=tiny_base_dir)
    assert not changed and again.revision == base_model.revision


@pytest.mark.slow
def test_the_preset_command_converts_and_imports_smollm2(settings, capsys):
    from tests.smollm2 import smollm2_dir

    folder = smollm2_dir()
    settings.MODELS_DIR = folder.parent
    call_command("import_base_model", "--preset", "smollm2-135m-instruct")
    row = BaseModel.objects.get(name="smollm2-135m-instruct")
    assert row.local_path == str(folder.resolve()) and row.is_default
    assert row.fingerprint | {"modules": None} == {
        "architecture": "LlamaForCausalLM",
        "num_layers": 30,
        "hidden": 576,
        "heads": 9,
        "kv_heads": 3,
        "head_dim": 64,
        "intermediate": 1536,
        "vocab": 49152,
        "modules": None,
    }
