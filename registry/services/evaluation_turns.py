"""Tenants take turns at evaluations: at most one of a tenant's evaluations runs at a time.

An evaluation scores its eval set twice on an engine (up to LORAPLEX_EVAL_MAX_TOKENS tokens
each time), minutes on a large base, and the evaluation workers run only a few at once.
Without turns, a tenant that uploads many versions fills every slot and another tenant's
evaluation waits behind all of them. With one each, a tenant's next evaluation waits for its
turn (the task asks again every TURN_PAUSE_SECONDS, its message going behind the others'),
and another tenant finds a slot free while fewer tenants than slots are evaluating.

The turn is claimed in the database under the tenant's row lock, so workers on several
hosts agree. An evaluation whose worker died is left to the sweep, and does not hold its
tenant's turn for longer than LORAPLEX_VALIDATION_DEADLINE_SECONDS.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from tenants.models import Tenant

from ..models import Evaluation

TURN_PAUSE_SECONDS = 5.0


class NotItsTurn(Exception):
    """Another of the tenant's evaluations is running: try again after `countdown` s."""

    def __init__(self, message: str, *, countdown: float = TURN_PAUSE_SECONDS):
        super().__init__(message)
        self.countdown = countdown


def tenant_of(evaluation_id: int) -> int | None:
    """The tenant whose version the evaluation measures; None when it is gone."""
    found = Evaluation.objects.filter(pk=evaluation_id)
    return found.values_list("version__adapter__tenant_id", flat=True).first()


def lock_tenant(tenant_id: int) -> None:
    """Hold the tenant's row for the caller's transaction: turns are claimed one at a time."""
    list(Tenant.objects.select_for_update().filter(pk=tenant_id).values_list("pk", flat=True))


def running_for_tenant(*, tenant_id: int, other_than: int) -> Evaluation | None:
    """The tenant's evaluation that holds its turn, other than `other_than`: running, and
    started within the sweep's deadline (an older one's worker died)."""
    alive = timezone.now() - timedelta(seconds=settings.VALIDATION_DEADLINE_SECONDS)
    return (
        Evaluation.objects.filter(
            version__adapter__tenant_id=tenant_id,
            status=Evaluation.Status.RUNNING,
            started_at__gte=alive,
        )
        .exclude(pk=other_than)
        .order_by("started_at")
        .first()
    )
