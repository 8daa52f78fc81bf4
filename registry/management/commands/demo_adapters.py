"""`make run`: give the demo tenant the trained demo adapters (idempotent; identical bytes dedupe)."""

from django.core.management.base import BaseCommand, CommandError

from registry.demo import DEMO_ADAPTERS
from registry.models import Adapter
from registry.selectors import base_model_default
from registry.services.adapters import adapter_create, adapter_update
from registry.services.aliases import alias_set
from registry.services.versions import adapter_version_create, adapter_version_validate
from tenants.models import Tenant

ACTOR = "system:demo"


class Command(BaseCommand):
    help = (
        "Upload the demo adapters committed in registry/demo/adapters (demo-french, demo-json, "
        "demo-pirate) to the demo tenant, validated and promoted to production."
    )

    def add_arguments(self, parser):
        parser.add_argument("--tenant", default="demo")

    def handle(self, tenant, **options):
        owner = Tenant.objects.filter(slug=tenant).first()
        if owner is None or base_model_default() is None:
            raise CommandError("Run bootstrap_demo and import_base_model first.")
        for demo in DEMO_ADAPTERS:
            adapter = Adapter.objects.filter(tenant=owner, name=demo.name).first()
            if adapter is None:
                adapter = adapter_create(
                    tenant=owner, name=demo.name, actor=ACTOR, description=demo.description
                )
            elif adapter.description != demo.description:
                adapter_update(adapter=adapter, actor=ACTOR, description=demo.description)
            with (
                open(demo.folder / "adapter_config.json", "rb") as c,
                open(demo.folder / "adapter_model.safetensors", "rb") as w,
            ):
                version, _ = adapter_version_create(
                    adapter=adapter, config=c, weights=w, actor=ACTOR
                )
            if version.status != version.READY:
                version = adapter_version_validate(version_id=version.pk) or version
            if version.status != version.READY:
                raise CommandError(f"{demo.name} was rejected: {version.report}")
            alias_set(
                adapter=adapter, name="production", version_number=version.number, actor=ACTOR
            )
            self.stdout.write(f"{demo.name}: v{version.number} ready ({demo.description})")
