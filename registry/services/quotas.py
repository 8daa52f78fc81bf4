"""Per-tenant quotas on the registry: versions awaiting validation, uploads and imports per
hour, bytes of stored versions.

`quota_check` is the one place they are enforced. `adapter_version_create` calls it before
storing anything (a cheap refusal) and again under the tenant's row lock where the version
row is created, so concurrent uploads cannot all slip under a limit; the API calls it once
more before reading a body, so an over-quota tenant does not get to fill the disk. A
tenant's own limit (set in the admin) overrides the deployment's default; 0 means no limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import F, Sum
from django.utils import timezone

from audit.selectors import audit_event_list
from tenants.models import Tenant

from ..errors import (
    AdapterBytesQuotaExceeded,
    PendingVersionsQuotaExceeded,
    UploadsPerHourQuotaExceeded,
)
from ..models import AdapterVersion

HOUR = timedelta(hours=1)
UPLOAD_VERB = "version.upload"  # audited per new version, and kept when adapters are deleted
PENDING_RETRY_AFTER_SECONDS = 30  # validating a version takes seconds


@dataclass(frozen=True)
class Quotas:
    pending_versions: int
    uploads_per_hour: int
    adapter_bytes: int


def tenant_quotas(tenant: Tenant) -> Quotas:
    def own_or_default(own: int | None, default: int) -> int:
        return default if own is None else own

    return Quotas(
        pending_versions=own_or_default(
            tenant.max_pending_versions, settings.QUOTA_PENDING_VERSIONS
        ),
        uploads_per_hour=own_or_default(
            tenant.max_uploads_per_hour, settings.QUOTA_UPLOADS_PER_HOUR
        ),
        adapter_bytes=own_or_default(tenant.max_adapter_bytes, settings.QUOTA_ADAPTER_BYTES),
    )


def quota_check(*, tenant: Tenant, new_bytes: int = 0, now: datetime | None = None) -> None:
    """Raise the QuotaExceeded of the first quota one more version of `new_bytes` would pass."""
    quotas = tenant_quotas(tenant)
    now = now or timezone.now()
    if quotas.uploads_per_hour:
        _uploads_per_hour(tenant, quotas.uploads_per_hour, now)
    if quotas.pending_versions:
        _pending_versions(tenant, quotas.pending_versions)
    if quotas.adapter_bytes:
        _adapter_bytes(tenant, quotas.adapter_bytes, new_bytes)


def _uploads_per_hour(tenant: Tenant, limit: int, now: datetime) -> None:
    recent = list(
        audit_event_list(tenant=tenant, verb=UPLOAD_VERB)
        .filter(created_at__gt=now - HOUR)
        .order_by("-created_at")
        .values_list("created_at", flat=True)[:limit]
    )
    if len(recent) < limit:
        return
    # A slot frees when the limit-th newest upload leaves the window.
    wait = max(1, math.ceil((recent[-1] + HOUR - now).total_seconds()))
    raise UploadsPerHourQuotaExceeded(
        f"tenant {tenant.slug} made {limit} uploads and imports in the last hour, its "
        f"uploads-per-hour quota; try again in {wait} s",
        headers={"Retry-After": str(wait)},
    )


def _pending_versions(tenant: Tenant, limit: int) -> None:
    waiting = AdapterVersion.objects.filter(
        adapter__tenant=tenant,
        status__in=[AdapterVersion.Status.PENDING, AdapterVersion.Status.VALIDATING],
    ).count()
    if waiting >= limit:
        raise PendingVersionsQuotaExceeded(
            f"tenant {tenant.slug} has {waiting} versions awaiting validation, its "
            f"pending-versions quota of {limit}; upload again once some are ready or rejected",
            headers={"Retry-After": str(PENDING_RETRY_AFTER_SECONDS)},
        )


def _adapter_bytes(tenant: Tenant, limit: int, new_bytes: int) -> None:
    stored = (
        AdapterVersion.objects.filter(adapter__tenant=tenant).aggregate(
            n=Sum(F("config_size") + F("weights_size"))
        )["n"]
        or 0
    )
    if stored + new_bytes > limit:
        raise AdapterBytesQuotaExceeded(
            f"tenant {tenant.slug} stores {stored} bytes of adapter versions; "
            + (f"{new_bytes} more " if new_bytes else "more ")
            + f"would pass its adapter-bytes quota of {limit} bytes; delete unused adapters "
            "or ask an operator for more"
        )
