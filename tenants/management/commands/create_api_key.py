from datetime import timedelta

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from tenants.models import Tenant
from tenants.services import api_key_create


class Command(BaseCommand):
    help = "Create an API key for a tenant. The key is printed alone on the last line, once."

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("--name", required=True)
        parser.add_argument(
            "--scopes", required=True, help="Comma-separated, e.g. inference,registry:read"
        )
        parser.add_argument("--expires-in-days", type=int)

    def handle(self, slug, name, scopes, expires_in_days, **options):
        tenant = Tenant.objects.filter(slug=slug).first()
        if tenant is None:
            raise CommandError(f"No tenant with slug {slug!r}.")
        if expires_in_days is not None and expires_in_days <= 0:
            raise CommandError("--expires-in-days must be a positive number of days.")
        expires_at = timezone.now() + timedelta(days=expires_in_days) if expires_in_days else None
        try:
            api_key, full = api_key_create(
                tenant=tenant, name=name, scopes=scopes, expires_at=expires_at
            )
        except ValidationError as exc:
            raise CommandError(
                "; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())
            ) from None
        self.stdout.write(
            f"Created key {api_key.name!r} ({', '.join(api_key.scopes)}) for {tenant.slug}:"
        )
        self.stdout.write(full)
