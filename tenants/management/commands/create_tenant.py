from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from tenants.services import tenant_create, user_get_or_create


class Command(BaseCommand):
    help = "Create a tenant, optionally with an owner (created if the email is new)."

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("--name", default="")
        parser.add_argument("--owner-email")
        parser.add_argument("--owner-password", help="Set the owner's password (for web sign-in).")

    def handle(self, slug, name, owner_email, owner_password, **options):
        owner = None
        if owner_email:
            owner = user_get_or_create(email=owner_email, password=owner_password)
        try:
            tenant = tenant_create(slug=slug, name=name, owner=owner)
        except ValidationError as exc:
            raise CommandError(
                "; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())
            ) from None
        self.stdout.write(
            f"Created tenant {tenant.slug}" + (f" owned by {owner_email}" if owner else "")
        )
