"""`make run`: give the demo tenant the trained demo adapters with their eval sets, and promote
each once the quality gate has measured it (idempotent: identical bytes dedupe)."""

import time

from django.core.management.base import BaseCommand, CommandError

from registry.demo import DEMO_ADAPTERS, DemoAdapter
from registry.models import Adapter, AdapterVersion, Alias, BaseModel, Evaluation
from registry.names import PRODUCTION
from registry.quality import figure
from registry.selectors import adapter_list, base_model_default
from registry.services.adapters import adapter_create, adapter_update
from registry.services.aliases import alias_set, alias_target_refusal
from registry.services.eval_sets import eval_set_attach
from registry.services.transitions import undecided
from registry.services.versions import adapter_version_create, adapter_version_validate
from tenants.models import Tenant
from tenants.selectors import tenant_find

ACTOR = "system:demo"
POLL_SECONDS = 1.0


class Command(BaseCommand):
    help = (
        f"Upload the demo adapters ({', '.join(demo.name for demo in DEMO_ADAPTERS)}) committed "
        "in registry/demo/adapters to a tenant (default: demo) with their eval sets, and "
        "promote each version once its evaluation passed."
    )

    def add_arguments(self, parser):
        parser.add_argument("--tenant", default="demo")
        parser.add_argument(
            "--wait",
            type=float,
            default=0,
            metavar="SECONDS",
            help="wait up to this long for the evaluations (a worker scores them on a running "
            "engine), then promote; 0: promote only what has passed already",
        )

    def handle(self, tenant, wait, **options):
        if wait < 0:
            raise CommandError("--wait must be 0 or more seconds")
        owner = tenant_find(slug=tenant)
        if owner is None or base_model_default() is None:
            raise CommandError("Run bootstrap_demo and import_base_model first.")
        versions = {demo.name: _install(demo, owner) for demo in DEMO_ADAPTERS}
        deadline = time.monotonic() + wait
        for demo in DEMO_ADAPTERS:
            version = _measured(versions[demo.name], deadline)
            self.stdout.write(f"{demo.name}: v{version.number} {_promote(version)}")


def _install(demo: DemoAdapter, owner: Tenant) -> AdapterVersion:
    """Attach the demo's eval set, then upload its files as any tenant's (validated at once:
    the evaluation is queued for the worker)."""
    adapter = _adapter(demo, owner)
    with open(demo.eval_set, "rb") as rows:
        eval_set_attach(adapter=adapter, file=rows, actor=ACTOR)
    with (
        open(demo.folder / "adapter_config.json", "rb") as c,
        open(demo.folder / "adapter_model.safetensors", "rb") as w,
    ):
        version, _ = adapter_version_create(adapter=adapter, config=c, weights=w, actor=ACTOR)
    if version.status != version.READY:
        version = adapter_version_validate(version_id=version.pk) or _decided(version)
    if version.status != version.READY:
        raise CommandError(f"{demo.name} was rejected: {version.report}")
    return version


def _decided(version: AdapterVersion) -> AdapterVersion:
    """A version the worker took to validate first (the upload queued it too): it is ready or
    rejected once the worker is done, or once the sweep gives a dead worker's run up."""
    version.refresh_from_db()
    while undecided(version):
        time.sleep(POLL_SECONDS)
        version.refresh_from_db()
    return version


def _settled(version: AdapterVersion) -> bool:
    """Checked against the base model's current revision and judged there: no evaluation
    queued or running, its quality no longer pending (a base upgrade re-checks, then
    re-evaluates every version)."""
    base = BaseModel.objects.get(pk=version.adapter.base_model_id)
    if version.checked_revision != base.revision or version.quality == version.Quality.PENDING:
        return False
    return not version.evaluations.filter(
        status__in=[Evaluation.Status.QUEUED, Evaluation.Status.RUNNING]
    ).exists()


def _measured(version: AdapterVersion, deadline: float) -> AdapterVersion:
    """The version once the gate has judged it on the current revision, or at the deadline."""
    while not _settled(version) and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
        version.refresh_from_db()
    version.refresh_from_db()
    return version


def _promote(version: AdapterVersion) -> str:
    """Point production at the version if the gate lets it; say where it stands."""
    verdict = _figures(version)
    refusal = alias_target_refusal(version)
    if refusal is not None:
        return f"not promoted: {refusal.message}"
    adapter = version.adapter
    production = Alias.objects.filter(adapter=adapter, name=PRODUCTION).first()
    if production is None or production.version_id != version.pk:
        alias_set(adapter=adapter, name=PRODUCTION, version_number=version.number, actor=ACTOR)
    return f"{verdict}, {adapter.name}@{PRODUCTION}"


def _figures(version: AdapterVersion) -> str:
    evaluation = version.latest_evaluation
    if evaluation is None or evaluation.adapter_perplexity is None:
        return f"{version.quality}: {version.quality_detail}"
    return (
        f"{evaluation.status}: perplexity {figure(evaluation.adapter_perplexity)} vs "
        f"{figure(evaluation.base_perplexity)} for the base model alone, on "
        f"{evaluation.eval_set.rows if evaluation.eval_set else '?'} rows of its eval set"
    )


def _adapter(demo: DemoAdapter, owner: Tenant) -> Adapter:
    """The tenant's adapter of the demo's name, described as the demo says."""
    adapter = adapter_list(tenant=owner).filter(name=demo.name).first()
    if adapter is None:
        return adapter_create(
            tenant=owner, name=demo.name, actor=ACTOR, description=demo.description
        )
    if adapter.description != demo.description:
        adapter = adapter_update(adapter=adapter, actor=ACTOR, description=demo.description)
    return adapter
