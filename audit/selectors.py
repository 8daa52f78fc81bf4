"""Reads of the audit trail, scoped to one tenant."""

from django.db.models import QuerySet

from .models import AuditEvent


def audit_event_list(*, tenant, verb: str | None = None) -> QuerySet[AuditEvent]:
    """The tenant's events, newest first; optionally one verb only."""
    events = AuditEvent.objects.filter(tenant=tenant)
    if verb:
        events = events.filter(verb=verb)
    return events
