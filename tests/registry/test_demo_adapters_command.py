"""`manage.py demo_adapters` (make run): the committed trained adapters reach the demo tenant
through the ordinary upload, validation and quality gate, once, each with its eval set, and
are promoted once the gate has measured them."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from audit.models import AuditEvent
from registry.demo import BASE_PRESET, DEMO_ADAPTERS
from registry.models import Adapter, AdapterVersion, Alias
from registry.services import evaluations
from registry.services.base_models import base_model_import
from tests.registry.conftest import FakeScorer, run_evaluations
from tests.smollm2 import smollm2_dir

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


def run(*args) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_seeds_each_demo_adapter_with_its_eval_set_and_promotes_it_once_measured(
    monkeypatch,
):
    base_model_import(name=BASE_PRESET, path=smollm2_dir(), default=True)
    run("bootstrap_demo")
    first = run("demo_adapters")  # no worker has measured anything yet
    for demo in DEMO_ADAPTERS:
        assert f"{demo.name}: v1 not promoted: v1 has not passed its evaluation: " in first
    adapters = Adapter.objects.filter(tenant__slug="demo").order_by("name")
    assert [(a.name, a.description) for a in adapters] == [
        (d.name, d.description) for d in DEMO_ADAPTERS
    ]
    for adapter, demo in zip(adapters, DEMO_ADAPTERS, strict=True):
        [version] = adapter.versions.all()
        assert version.status == AdapterVersion.READY
        assert version.quality == AdapterVersion.Quality.PENDING
        own = adapter.eval_sets.get(is_current=True)
        assert own.rows == len(demo.eval_set.read_text().splitlines()) >= 10
    assert not Alias.objects.exists()

    # What the worker does with a running engine (scored here by the engine's stand-in).
    monkeypatch.setattr(evaluations, "score_on_engine", FakeScorer(default_ppl=4, base_ppl=40))
    run_evaluations()
    second = run("demo_adapters")
    third = run("demo_adapters")  # make run calls it at every start
    assert second == third
    for demo in DEMO_ADAPTERS:
        assert (
            f"{demo.name}: v1 passed: perplexity 4 vs 40 for the base model alone, on 12 rows "
            f"of its eval set, {demo.name}@production"
        ) in second
    for adapter in adapters:
        [version] = adapter.versions.all()  # identical bytes: no second version
        assert adapter.aliases.get(name="production").version == version
        assert adapter.eval_sets.count() == 1  # the same bytes: no second set
    assert AuditEvent.objects.filter(verb="alias.set").count() == len(DEMO_ADAPTERS)


def test_refuses_before_the_base_model_and_the_demo_tenant_exist():
    with pytest.raises(CommandError, match="bootstrap_demo and import_base_model"):
        run("demo_adapters")
    assert not Adapter.objects.exists()


def test_a_version_the_worker_validates_first_is_waited_for_not_called_rejected(monkeypatch):
    """The upload queues validation too: when the worker claims a version before the command
    validates it inline, the command waits for the worker's verdict."""
    from registry.management.commands import demo_adapters as command
    from registry.services.versions import adapter_version_validate

    base_model_import(name=BASE_PRESET, path=smollm2_dir(), default=True)
    run("bootstrap_demo")

    def claimed_by_the_worker(*, version_id):
        return None  # _start found it taken: the worker validates it

    waited = []

    def worker_finishes(seconds):  # the command's poll: the worker's verdict lands meanwhile
        waited.append(seconds)
        for version in AdapterVersion.objects.exclude(status=AdapterVersion.READY):
            adapter_version_validate(version_id=version.pk)

    monkeypatch.setattr(command, "adapter_version_validate", claimed_by_the_worker)
    monkeypatch.setattr(command.time, "sleep", worker_finishes)
    out = run("demo_adapters")
    assert "rejected" not in out and waited
    assert set(AdapterVersion.objects.values_list("status", flat=True)) == {AdapterVersion.READY}
