"""Reading usage records: the one usage selector, for the REST API and the pages alike.

"Per adapter" has one meaning: a request counts for the adapter version it ran, whatever
the client called it (`bot`, `bot@canary` and `bot:3` are all version 3 of `bot`); a
request that ran no adapter counts under the model name it sent, which is the base
model's (or, once an adapter is deleted, the name its old requests used).
"""

from datetime import datetime

from django.db.models import Count, F, Sum
from django.db.models.functions import Coalesce, TruncDate

from .models import Tenant, UsageRecord

KEYS = {
    "day": TruncDate("created_at"),
    "adapter": Coalesce(F("adapter_version__adapter__name"), F("model")),
    "version": F("adapter_version__number"),  # None for the base model
}
# What GET /api/v1/usage/?group_by= offers, and the keys each one groups by.
GROUPINGS = {"adapter": ("adapter", "version"), "day": ("day",)}


def usage_totals(
    *, tenant: Tenant, start: datetime, end: datetime, by: tuple[str, ...]
) -> list[dict]:
    """Requests and tokens in [start, end), one row per value of the `by` keys (see KEYS).

    Rows hold the keys (day as a date) and requests, prompt/completion/total tokens,
    ordered by the keys, the base model's null version first.
    """
    unknown = set(by) - set(KEYS)
    if unknown:
        raise ValueError(f"cannot group usage by {', '.join(sorted(unknown))}")
    rows = (
        UsageRecord.objects.filter(tenant=tenant, created_at__gte=start, created_at__lt=end)
        .annotate(**{key: KEYS[key] for key in by})
        .values(*by)
        .annotate(
            requests=Count("id"),
            prompt_tokens=Sum("prompt_tokens"),
            completion_tokens=Sum("completion_tokens"),
        )
        .order_by(*(F(key).asc(nulls_first=True) for key in by))
    )
    return [row | {"total_tokens": row["prompt_tokens"] + row["completion_tokens"]} for row in rows]


def usage_by_version(*, version_ids, since: datetime) -> dict[int, int]:
    """Requests per adapter version since `since`, for the versions given (absent: none).

    Across tenants: the registry orders its background work by it (re-evaluations after a
    base model upgrade, most-used versions first); nothing here is shown to a tenant.
    """
    rows = (
        UsageRecord.objects.filter(adapter_version_id__in=list(version_ids), created_at__gte=since)
        .values("adapter_version_id")
        .annotate(requests=Count("id"))
    )
    return {row["adapter_version_id"]: row["requests"] for row in rows}
