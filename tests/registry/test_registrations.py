"""vLLM's load call registers files as a version (services/registrations.py): on the calling
replica's base model, never across base models."""

import pytest

from registry.errors import NotServable
from registry.services.base_models import base_model_import
from registry.services.lora_sources import LocalFolder
from registry.services.registrations import adapter_version_register

from .conftest import ALICE_ACTOR

pytestmark = pytest.mark.django_db


@pytest.fixture
def second_base(base_model, tiny_base_dir):
    """Another base model beside the default one (the same shapes, its own name)."""
    return base_model_import(name="tiny-second", path=tiny_base_dir, default=False)[0]


def register(tenant, name, folder, base_model_name=None):
    return adapter_version_register(
        tenant=tenant,
        adapter_name=name,
        source=LocalFolder(folder, roots=None),
        actor=ALICE_ACTOR,
        replace=False,
        base_model_name=base_model_name,
    )


def test_a_new_adapter_goes_on_the_calling_replicas_base_model(
    tenant_a, second_base, good_adapter_dir
):
    registered = register(tenant_a, "on-second", good_adapter_dir, "tiny-second")
    assert registered.version.adapter.base_model == second_base
    assert registered.version.status == "ready"


def test_without_a_replica_base_model_the_default_one_takes_it(
    tenant_a, base_model, second_base, good_adapter_dir
):
    assert register(tenant_a, "on-default", good_adapter_dir).version.adapter.base_model == (
        base_model
    )


def test_files_for_an_adapter_of_another_base_model_are_refused_naming_both(
    tenant_a, base_model, second_base, good_adapter_dir
):
    register(tenant_a, "bot", good_adapter_dir)  # on the default base model
    with pytest.raises(NotServable) as refused:
        register(tenant_a, "bot", good_adapter_dir, "tiny-second")
    message = refused.value.message
    assert f"of base model {base_model.name}, not of tiny-second" in message
    assert second_base.adapters.count() == 0  # nothing created on the other one
