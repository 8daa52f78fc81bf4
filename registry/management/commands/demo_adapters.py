"""`make run`: give the demo tenant a few ready adapters (idempotent; identical bytes dedupe)."""

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from inference.engine.lora.peft_rules import ArchFingerprint
from registry.demo import DEMO_ADAPTERS, write_demo_adapter
from registry.models import Adapter
from registry.selectors import base_model_served
from registry.services.adapters import adapter_create
from registry.services.aliases import alias_set
from registry.services.versions import adapter_version_create, adapter_version_validate
from tenants.models import Tenant

ACTOR = "system:demo"


class Command(BaseCommand):
    help = (
        "Create the demo tenant's adapters (demo-attn, demo-mlp, demo-all), validated and promoted."
    )

    def add_arguments(self, parser):
        parser.add_argument("--tenant", default="demo")

    def handle(self, tenant, **options):
        owner = Tenant.objects.filter(slug=tenant).first()
        base = base_model_served()
        if owner is None or base is None:
            raise CommandError("Run bootstrap_demo and import_base_model first.")
        fingerprint = ArchFingerprint.from_dict(base.fingerprint)
        for name, (seed, rank, targets, std) in DEMO_ADAPTERS.items():
            folder = write_demo_adapter(
                settings.VAR_DIR / "demo-adapters" / name,
                fingerprint=fingerprint,
                base_name=base.name,
                seed=seed,
                rank=rank,
                targets=targets,
                std=std,
            )
            adapter = Adapter.objects.filter(tenant=owner, name=name).first() or adapter_create(
                tenant=owner,
                name=name,
                actor=ACTOR,
                description="Demo adapter (seeded random weights).",
            )
            with (
                open(folder / "adapter_config.json", "rb") as c,
                open(folder / "adapter_model.safetensors", "rb") as w,
            ):
                version, _ = adapter_version_create(
                    adapter=adapter, config=c, weights=w, actor=ACTOR
                )
            if version.status != version.READY:
                version = adapter_version_validate(version_id=version.pk) or version
            if version.status != version.READY:
                raise CommandError(f"{name} was rejected: {version.report}")
            alias_set(
                adapter=adapter, name="production", version_number=version.number, actor=ACTOR
            )
            self.stdout.write(f"{name}: v{version.number} ready")
