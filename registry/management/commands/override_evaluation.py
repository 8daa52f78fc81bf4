from django.core.management.base import BaseCommand, CommandError

from registry.errors import RegistryError
from registry.services.evaluations import evaluation_override

from ._versions import versions_named


class Command(BaseCommand):
    help = (
        "Let adapter versions whose evaluation degraded (or failed) serve on their base model's "
        "current revision anyway, until its next revision. Audited in the tenant's trail as "
        "evaluation.override."
    )

    def add_arguments(self, parser):
        parser.add_argument("versions", nargs="+", help="<tenant>/<adapter>:<n>")
        parser.add_argument(
            "--by", required=True, help="who decides (recorded as operator:<by> in the audit trail)"
        )
        parser.add_argument("--note", default="", help="why, for the audit trail")

    def handle(self, versions, by, note, **options):
        failed = []
        for version in versions_named(versions):
            try:
                evaluation_override(version=version, actor=f"operator:{by}", note=note)
            except RegistryError as exc:
                failed.append(f"{version}: {exc.message}")
                continue
            self.stdout.write(f"{version}: overridden")
        if failed:
            raise CommandError("\n".join(failed))
