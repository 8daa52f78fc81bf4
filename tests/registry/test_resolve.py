"""What the serving layer gets: model strings resolve within the tenant to servable versions."""

import pytest
from django.http import Http404

from registry.errors import NotServable
from registry.model_names import ModelRef, parse_model_name, parse_qualified_name
from registry.selectors import adapter_version_resolve, base_model_default
from registry.services.aliases import alias_set
from tests.registry.conftest import ALICE_ACTOR, make_ready_version

pytestmark = pytest.mark.django_db


@pytest.fixture
def versions(adapter, good_adapter_dir, second_adapter_dir):
    return make_ready_version(adapter, good_adapter_dir), make_ready_version(
        adapter, second_adapter_dir
    )


def resolve(tenant, name, **kw):
    return adapter_version_resolve(tenant=tenant, adapter_name=name, **kw).number


def test_model_strings_parse_into_adapter_alias_and_number():
    assert parse_model_name("bot") == ModelRef("bot")
    assert parse_model_name("bot@canary") == ModelRef("bot", alias="canary")
    assert parse_model_name("bot:3") == ModelRef("bot", number=3)
    for bad in ("", "../bot", "bot@", "bot:0", "bot:x", "Bot", "a@b@c", "bot:1:2", None):
        assert parse_model_name(bad) is None, bad


def test_qualified_names_round_trip_through_the_one_codec():
    for text in ("tenant-a/bot", "tenant-a/bot@canary", "tenant-a/bot:3"):
        ref = parse_qualified_name(text)
        assert ref is not None and ref.tenant == "tenant-a" and str(ref) == text
    assert parse_qualified_name("tenant-a/bot:3") == ModelRef("bot", number=3, tenant="tenant-a")
    for unqualified in ("bot", "bot@canary", "bot:3"):
        assert str(parse_model_name(unqualified)) == unqualified
    for bad in ("bot", "/bot", "tenant-a/", "tenant-a/bot:0", "a/b/c", "tenant a/bot", None, 7):
        assert parse_qualified_name(bad) is None, bad


def test_versions_and_aliases_are_named_by_the_codec(tenant_a, adapter, versions):
    from registry.model_names import alias_name, version_name

    alias, _ = alias_set(adapter=adapter, name="production", version_number=1, actor=ALICE_ACTOR)
    assert version_name(versions[1]) == "tenant-a/support-bot:2"
    assert alias_name(alias) == "tenant-a/support-bot@production"
    assert alias_name(alias, qualified=False) == "support-bot@production"


def test_the_bare_name_follows_production_else_the_latest_ready(tenant_a, adapter, versions):
    assert resolve(tenant_a, "support-bot") == 2
    alias_set(adapter=adapter, name="production", version_number=1, actor=ALICE_ACTOR)
    assert resolve(tenant_a, "support-bot") == 1
    assert resolve(tenant_a, "support-bot", alias="latest") == 2
    assert resolve(tenant_a, "support-bot", alias="v2") == 2
    assert resolve(tenant_a, "support-bot", number=1) == 1
    assert resolve(tenant_a, "support-bot", alias="production") == 1


def test_a_canary_takes_its_weight_of_bare_name_requests(tenant_a, adapter, versions):
    alias_set(adapter=adapter, name="production", version_number=1, actor=ALICE_ACTOR)
    alias_set(adapter=adapter, name="canary", version_number=2, weight=25, actor=ALICE_ACTOR)
    picks = [resolve(tenant_a, "support-bot", roll=i / 100) for i in range(100)]
    assert picks.count(2) == 25 and picks.count(1) == 75
    assert resolve(tenant_a, "support-bot", alias="canary", roll=0.99) == 2


def test_foreign_and_unknown_names_are_404(tenant_a, tenant_b, adapter, versions):
    for kwargs in ({}, {"alias": "production"}, {"number": 7}):
        with pytest.raises(Http404):
            adapter_version_resolve(tenant=tenant_b, adapter_name="support-bot", **kwargs)
    with pytest.raises(Http404):
        adapter_version_resolve(tenant=tenant_a, adapter_name="support-bot", alias="nope")


def test_a_version_that_may_not_be_served_says_why(tenant_a, adapter, versions, base_model):
    base_model.revision = "f" * 64
    base_model.save()
    with pytest.raises(NotServable, match="not been checked against tiny-llama"):
        resolve(tenant_a, "support-bot", number=1)
    with pytest.raises(NotServable, match="no servable version .* not been checked against"):
        resolve(tenant_a, "support-bot")


def test_the_served_base_model_is_one_row_with_its_local_path(base_model, tiny_base_dir):
    served = base_model_default()
    assert served.name == "tiny-llama" and served.local_path == str(tiny_base_dir.resolve())
