"""Writing the audit trail: one call per state change that matters to a tenant."""

import json
from dataclasses import dataclass
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from .models import AuditEvent

SYSTEM_VALIDATOR = "system:validator"
SYSTEM_SWEEP = "system:sweep"
SYSTEM_COMPATIBILITY = "system:compatibility"
SYSTEM_EVALUATOR = "system:evaluator"


@dataclass(frozen=True)
class Subject:
    """What an event is about: the tenant that owns it, its kind, and the name people know it by."""

    tenant: Any  # a tenants.Tenant (tenants records its changes here: it cannot be imported)
    type: str
    name: str


def snapshot(obj, *fields: str, **values) -> dict:
    """`fields` of obj, plus computed `values`: the state an event's before and after record."""
    return {name: getattr(obj, name) for name in fields} | values


def _jsonable(value):
    """Snapshots may hold datetimes; store them as the API would render them."""
    return None if value is None else json.loads(json.dumps(value, cls=DjangoJSONEncoder))


def audit_record(
    *,
    subject: Subject,
    actor: str,
    verb: str,
    before: dict | None = None,
    after: dict | None = None,
) -> AuditEvent:
    event = AuditEvent(
        tenant=subject.tenant,
        actor=actor[:100],
        verb=verb,
        object_type=subject.type,
        object_repr=subject.name[:200],
        before=_jsonable(before),
        after=_jsonable(after),
    )
    event.full_clean()
    event.save()
    return event
