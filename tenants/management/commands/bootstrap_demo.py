"""`make run`'s first step: a demo tenant, a demo user, a working API key and an operator
account for the admin, idempotently.

The key and the operator's password are kept in LORAPLEX_VAR_DIR (demo_api_key,
demo_operator_password; mode 0600, development only) so every `make run` prints the same ones
instead of piling up new ones.
"""

import secrets

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from tenants.keyauth import KeyRejected, api_key_from_header
from tenants.models import Tenant
from tenants.scopes import ALL_SCOPES
from tenants.services import api_key_create, tenant_create, user_get_or_create

DEMO_SLUG = "demo"
DEMO_EMAIL = "demo@loraplex.local"
DEMO_PASSWORD = "loraplex-demo"
# A superuser: the admin at /admin/, and the operator endpoints from a signed-in session.
OPERATOR_EMAIL = "operator@loraplex.local"


class Command(BaseCommand):
    help = (
        "Create the demo tenant, user, API key and operator account (development only); "
        "print the key last."
    )

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
        operator_password = _operator_password()
        operator = user_get_or_create(email=OPERATOR_EMAIL, password=operator_password)
        if not (operator.is_staff and operator.is_superuser):
            operator.is_staff = operator.is_superuser = True
            operator.save(update_fields=["is_staff", "is_superuser"])
        self.stdout.write(
            f"Demo tenant '{tenant.slug}'; web sign-in {DEMO_EMAIL} / {DEMO_PASSWORD}"
        )
        self.stdout.write(
            f"Operator (the admin at /admin/): {OPERATOR_EMAIL} / {operator_password}"
        )
        self.stdout.write("Demo API key:")
        self.stdout.write(key)


def _operator_password() -> str:
    """The demo operator's password: made once per var dir, then the same on every run."""
    path = settings.VAR_DIR / "demo_operator_password"
    if path.exists() and (password := path.read_text().strip()):
        return password
    password = secrets.token_urlsafe(12)
    path.write_text(password)
    path.chmod(0o600)
    return password
