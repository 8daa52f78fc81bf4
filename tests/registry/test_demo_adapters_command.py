"""`manage.py demo_adapters` (make run): the committed trained adapters reach the demo tenant
through the ordinary upload and validation, once, described by what each one does."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from registry.demo import BASE_PRESET, DEMO_ADAPTERS
from registry.models import Adapter, AdapterVersion
from registry.services.base_models import base_model_import
from tests.smollm2 import smollm2_dir

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


def run(*args) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_seeds_each_demo_adapter_ready_in_production_and_is_idempotent():
    base_model_import(name=BASE_PRESET, path=smollm2_dir(), default=True)
    run("bootstrap_demo")
    first = run("demo_adapters")
    second = run("demo_adapters")  # make run calls it at every start
    assert first == second
    for demo in DEMO_ADAPTERS:
        assert f"{demo.name}: v1 ready ({demo.description})" in first
    adapters = Adapter.objects.filter(tenant__slug="demo").order_by("name")
    assert [(a.name, a.description) for a in adapters] == [
        (d.name, d.description) for d in DEMO_ADAPTERS
    ]
    for adapter in adapters:
        [version] = adapter.versions.all()  # identical bytes: no second version
        assert version.status == AdapterVersion.READY
        assert adapter.aliases.get(name="production").version == version


def test_refuses_before_the_base_model_and_the_demo_tenant_exist():
    with pytest.raises(CommandError, match="bootstrap_demo and import_base_model"):
        run("demo_adapters")
    assert not Adapter.objects.exists()
