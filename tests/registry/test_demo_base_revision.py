"""`manage.py demo_base_revision`: a second revision of the demo's base model, so a base
upgrade and the quality gate's re-evaluation can be tried on `make run`; and `make run`'s
`import_base_model --if-missing` keeps the revision imported since."""

from io import StringIO

import pytest
import torch
from django.core.management import CommandError, call_command
from safetensors.torch import load_file

from registry.demo import BASE_PRESET
from registry.models import AdapterVersion, BaseModel
from registry.services.base_models import base_model_import
from tests.smollm2 import smollm2_dir
from tests.ui.conftest import make_version

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


def run(*args) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


@pytest.fixture
def demo_base(settings, tmp_path):
    settings.MODELS_DIR = tmp_path / "models"
    return base_model_import(name=BASE_PRESET, path=smollm2_dir(), default=True)[0]


def test_a_nudged_revision_is_imported_and_puts_the_versions_back_to_pending(
    demo_base, tenant_a, settings
):
    from registry.demo import DEMO_ADAPTERS
    from registry.services.adapters import adapter_create

    adapter = adapter_create(tenant=tenant_a, name="pirate", actor="user:alice@example.com")
    version = make_version(adapter, DEMO_ADAPTERS[2].folder)
    assert version.quality == AdapterVersion.Quality.PASSED  # unmeasured: no eval set here

    said = run("demo_base_revision", "--scale", "0.01")
    base = BaseModel.objects.get(name=BASE_PRESET)
    assert base.revision != demo_base.revision
    assert f"{BASE_PRESET} revision {base.revision[:12]}" in said and "restart the engine" in said
    version.refresh_from_db()
    assert version.quality == AdapterVersion.Quality.PENDING  # until re-checked, re-evaluated

    before = load_file(smollm2_dir() / "model.safetensors")
    after = load_file(settings.MODELS_DIR / f"{BASE_PRESET}-noise0.01-seed1" / "model.safetensors")
    assert before.keys() == after.keys()
    name = "model.layers.0.self_attn.q_proj.weight"
    relative = (after[name].float() - before[name].float()).abs() / before[name].float().abs()
    assert 0 < relative[before[name] != 0].median() < 0.05  # a nudge, not new weights
    norm = "model.layers.0.input_layernorm.weight"
    assert torch.equal(after[norm], before[norm])  # only the matrices move

    assert "already serves revision" in run("demo_base_revision", "--scale", "0.01")
    kept = run("import_base_model", "--preset", BASE_PRESET, "--if-missing")
    assert kept.endswith("already imported, kept\n")
    assert BaseModel.objects.get(name=BASE_PRESET).revision == base.revision


def test_bad_arguments_are_refused(demo_base):
    with pytest.raises(CommandError, match="--scale must be above 0 and at most 1"):
        run("demo_base_revision", "--scale", "0")
    with pytest.raises(CommandError, match="no base model named 'nope'"):
        run("demo_base_revision", "--name", "nope")
