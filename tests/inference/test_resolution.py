"""Model name resolution alone: the one function where inference meets tenant isolation."""

import pytest

from inference.errors import BaseModelUnavailable
from inference.resolution import ModelNotFound, ModelNotServable, resolve_model
from registry.services.adapters import adapter_create
from registry.services.aliases import alias_set
from registry.services.base_models import base_model_import
from registry.services.versions import adapter_version_create, adapter_version_validate
from tests.peft_adapters import make_peft_adapter
from tests.tiny_llama import make_tiny_llama

BASE = "tiny-resolve"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resolve")
    base = make_tiny_llama(tmp / "base")
    return base, [
        make_peft_adapter(base, tmp / f"a{i}", rank=4, seed=i, base_model_name=BASE)
        for i in range(2)
    ]


@pytest.fixture
def bot(db, folders, tenant_a, settings, tmp_path):
    """Adapter `bot` of tenant A with two ready versions; production -> v1, canary -> v2."""
    settings.STORAGES = {
        **settings.STORAGES,
        "default": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path)},
        },
    }
    base_dir, adapters = folders
    base_model_import(name=BASE, path=base_dir, default=True)
    adapter = adapter_create(tenant=tenant_a, name="bot", actor="test")
    for folder in adapters:
        with (
            open(folder / "adapter_config.json", "rb") as c,
            open(folder / "adapter_model.safetensors", "rb") as w,
        ):
            version, _ = adapter_version_create(adapter=adapter, config=c, weights=w, actor="test")
        assert adapter_version_validate(version_id=version.pk).status == "ready"
    alias_set(adapter=adapter, name="production", version_number=1, actor="test")
    return adapter


def resolve(tenant, name, roll=None):
    return resolve_model(tenant=tenant, name=name, base_model_name=BASE, roll=roll)


def test_the_base_model_name_means_no_adapter(bot, tenant_a):
    resolved = resolve(tenant_a, BASE)
    assert resolved.version is None and resolved.lora_request is None


def test_names_resolve_to_versions(bot, tenant_a):
    assert resolve(tenant_a, "bot").version.number == 1  # production
    assert resolve(tenant_a, "bot:2").version.number == 2
    assert resolve(tenant_a, "bot@latest").version.number == 2
    assert resolve(tenant_a, "bot@production").version.number == 1
    lora = resolve(tenant_a, "bot").lora_request
    assert lora.name == "tenant-a/bot:1" and lora.adapter_id == str(bot.versions.get(number=1).uid)


@pytest.mark.parametrize("name", ["ghost", "bot:9", "bot@nope", "../bot", "", "BOT"])
def test_unknown_names_are_not_found(bot, tenant_a, name):
    with pytest.raises(ModelNotFound):
        resolve(tenant_a, name)


def test_another_tenants_adapter_is_not_found_exactly_like_a_missing_one(bot, tenant_b):
    with pytest.raises(ModelNotFound) as foreign:
        resolve(tenant_b, "bot")
    with pytest.raises(ModelNotFound) as missing:
        resolve(tenant_b, "bot2")
    assert str(foreign.value).replace("'bot'", "X") == str(missing.value).replace("'bot2'", "X")


def test_a_version_that_is_not_ready_is_not_servable(bot, tenant_a, folders):
    from registry.models import AdapterVersion

    AdapterVersion.objects.filter(adapter=bot, number=2).update(status="validating")
    with pytest.raises(ModelNotServable, match="bot:2"):
        resolve(tenant_a, "bot:2")


def test_canary_weight_20_takes_about_a_fifth_of_the_traffic(bot, tenant_a):
    alias_set(adapter=bot, name="canary", version_number=2, actor="test", weight=20)
    picks = [resolve(tenant_a, "bot").version.number for _ in range(500)]
    share = picks.count(2) / len(picks)
    # Binomial(500, 0.2): sd 0.018, so [0.13, 0.27] is a ~4-sigma bound.
    assert 0.13 <= share <= 0.27, share
    assert (
        resolve(tenant_a, "bot@production").version.number == 1
    )  # explicit names ignore the canary


@pytest.fixture
def other_base(bot, folders, tenant_a):
    """A second base model, not this replica's, and tenant A's adapter `elsewhere` on it
    with a ready version."""
    base_dir, adapters = folders
    other, _ = base_model_import(name="tiny-other", path=base_dir, default=False)
    adapter = adapter_create(
        tenant=tenant_a, name="elsewhere", actor="test", base_model_name="tiny-other"
    )
    with (
        open(adapters[0] / "adapter_config.json", "rb") as c,
        open(adapters[0] / "adapter_model.safetensors", "rb") as w,
    ):
        version, _ = adapter_version_create(adapter=adapter, config=c, weights=w, actor="test")
    assert adapter_version_validate(version_id=version.pk).status == "ready"
    return other


def test_another_base_models_name_answers_that_it_is_served_elsewhere(other_base, tenant_a):
    with pytest.raises(BaseModelUnavailable) as refused:
        resolve(tenant_a, "tiny-other")
    assert refused.value.status == 503
    assert "base model 'tiny-other'" in refused.value.message
    assert f"it serves '{BASE}'" in refused.value.message


def test_an_adapter_of_another_base_model_answers_503_naming_it(other_base, tenant_a):
    for name in ("elsewhere", "elsewhere:1", "elsewhere@latest"):
        with pytest.raises(BaseModelUnavailable) as refused:
            resolve(tenant_a, name)
        assert f"'{name}' runs on base model 'tiny-other'" in refused.value.message
        assert refused.value.param == "model"


def test_a_replica_of_the_other_base_model_serves_it(other_base, tenant_a):
    resolved = resolve_model(tenant=tenant_a, name="elsewhere", base_model_name="tiny-other")
    assert resolved.version.adapter.base_model == other_base
    with pytest.raises(BaseModelUnavailable, match="runs on base model 'tiny-resolve'"):
        resolve_model(tenant=tenant_a, name="bot", base_model_name="tiny-other")
