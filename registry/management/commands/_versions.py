"""Finding adapter versions by the names operators use: `tenant/adapter:n`."""

from django.core.management.base import CommandError

from registry.model_names import parse_qualified_name
from registry.models import AdapterVersion


def versions_named(names: list[str]) -> list[AdapterVersion]:
    """Each `tenant/adapter:n`, or CommandError naming the first that is not one."""
    found = []
    for name in names:
        ref = parse_qualified_name(name)
        if ref is None or ref.number is None:
            raise CommandError(f"{name!r}: name a version as <tenant>/<adapter>:<n>")
        version = (
            AdapterVersion.objects.select_related("adapter__tenant", "adapter__base_model")
            .filter(adapter__tenant__slug=ref.tenant, adapter__name=ref.adapter, number=ref.number)
            .first()
        )
        if version is None:
            raise CommandError(f"{name}: no such version")
        found.append(version)
    return found
