"""`make run`'s first step: a demo tenant, a demo user and a working API key, idempotently.

The key is kept in LORAPLEX_VAR_DIR/demo_api_key (mode 0600, development only) so every
`make run` prints the same key instead of piling up new ones.
"""

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from tenants.keyauth import KeyRejected, api_key_from_header
from tenants.models import Tenant
from tenants.scopes import ALL_SCOPES
from tenants.services import api_key_create, tenant_create, user_get_or_create

DEMO_SLUG = "demo"
DEMO_EMAIL = "demo@loraplex.local"
DEMO_PASSWORD = "loraplex-demo"


class Command(BaseCommand):
    help = "Create the demo tenant, user and API key (development only); print the key last."

    def handle(self, **options):
        if settings.PRODUCTION:
            raise CommandError(
                "bootstrap_demo is for development; create tenants with create_tenant."
            )
        owner = user_get_or_create(email=DEMO_EMAIL, password=DEMO_PASSWORD)
        tenant = Tenant.objects.filter(slug=DEMO_SLUG).first() or tenant_create(
            slug=DEMO_SLUG, name="Demo tenant", owner=owner
        )
        key_file = settings.VAR_DIR / "demo_api_key"
        key = key_file.read_text().strip() if key_file.exists() else ""
        try:
            api_key_from_header(f"Bearer {key}")
        except KeyRejected:
            _, key = api_key_create(
                tenant=tenant, name="demo", scopes=list(ALL_SCOPES), created_by=owner
            )
            key_file.write_text(key)
            key_file.chmod(0o600)
        self.stdout.write(
            f"Demo tenant '{tenant.slug}'; web sign-in {DEMO_EMAIL} / {DEMO_PASSWORD}"
        )
        self.stdout.write("Demo API key:")
        self.stdout.write(key)
