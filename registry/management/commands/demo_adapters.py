"""`make run`: give the demo tenant the trained demo adapters (idempotent: identical bytes
dedupe)."""

from django.core.management.base import BaseCommand, CommandError

from registry.demo import DEMO_ADAPTERS, DemoAdapter
from registry.models import Adapter, AdapterVersion
from registry.selectors import adapter_list, base_model_default
from registry.services.adapters import adapter_create, adapter_update
from registry.services.aliases import alias_set
from registry.services.versions import adapter_version_create, adapter_version_validate
from tenants.models import Tenant
from tenants.selectors import tenant_find

ACTOR = "system:demo"


class Command(BaseCommand):
    help = (
        f"Upload the demo adapters ({', '.join(demo.name for demo in DEMO_ADAPTERS)}) committed "
        "in registry/demo/adapters to a tenant (default: demo), validated and promoted."
    )

    def add_arguments(self, parser):
        parser.add_argument("--tenant", default="demo")

    def handle(self, tenant, **options):
        owner = tenant_find(slug=tenant)
        if owner is None or base_model_default() is None:
            raise CommandError("Run bootstrap_demo and import_base_model first.")
        for demo in DEMO_ADAPTERS:
            version = _install(demo, owner)
            self.stdout.write(f"{demo.name}: v{version.number} ready ({demo.description})")


def _install(demo: DemoAdapter, owner: Tenant) -> AdapterVersion:
    """Upload the demo's files as any tenant's (validated at once) and promote them."""
    adapter = _adapter(demo, owner)
    with (
        open(demo.folder / "adapter_config.json", "rb") as c,
        open(demo.folder / "adapter_model.safetensors", "rb") as w,
    ):
        version, _ = adapter_version_create(adapter=adapter, config=c, weights=w, actor=ACTOR)
    if version.status != version.READY:
        version = adapter_version_validate(version_id=version.pk) or version
    if version.status != version.READY:
        raise CommandError(f"{demo.name} was rejected: {version.report}")
    alias_set(adapter=adapter, name="production", version_number=version.number, actor=ACTOR)
    return version


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
