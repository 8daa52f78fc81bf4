"""The audit trail: one call per state change that matters to a tenant."""

from django.core.serializers.json import DjangoJSONEncoder

from .models import AuditEvent

SYSTEM_VALIDATOR = "system:validator"
SYSTEM_SWEEP = "system:sweep"
SYSTEM_COMPATIBILITY = "system:compatibility"


def _jsonable(value):
    """before/after snapshots may hold datetimes; store them as the API would render them."""
    import json

    return None if value is None else json.loads(json.dumps(value, cls=DjangoJSONEncoder))


def audit_record(
    *,
    tenant,
    actor: str,
    verb: str,
    object_type: str,
    object_repr: str,
    before: dict | None = None,
    after: dict | None = None,
) -> AuditEvent:
    event = AuditEvent(
        tenant=tenant,
        actor=actor[:100],
        verb=verb,
        object_type=object_type,
        object_repr=object_repr[:200],
        before=_jsonable(before),
        after=_jsonable(after),
    )
    event.full_clean()
    event.save()
    return event
