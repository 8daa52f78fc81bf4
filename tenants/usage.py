"""Reading usage records: totals per adapter or per day for one tenant (the one usage selector)."""

from datetime import datetime

from django.db.models import Count, F, Sum
from django.db.models.functions import TruncDate

from .models import Tenant, UsageRecord

GROUPINGS = ("adapter", "day")


def usage_summary(*, tenant: Tenant, start: datetime, end: datetime, group_by: str) -> list[dict]:
    """Rows of requests and tokens in [start, end), grouped by adapter (model name) or by day."""
    if group_by not in GROUPINGS:
        raise ValueError(f"group_by must be one of {', '.join(GROUPINGS)}")
    records = UsageRecord.objects.filter(tenant=tenant, created_at__gte=start, created_at__lt=end)
    key = F("model") if group_by == "adapter" else TruncDate("created_at")
    rows = (
        records.annotate(group=key)
        .values("group")
        .annotate(
            requests=Count("id"),
            prompt_tokens=Sum("prompt_tokens"),
            completion_tokens=Sum("completion_tokens"),
        )
        .order_by("group")
    )
    return [
        {
            group_by: row["group"].isoformat() if group_by == "day" else row["group"],
            "requests": row["requests"],
            "prompt_tokens": row["prompt_tokens"] or 0,
            "completion_tokens": row["completion_tokens"] or 0,
            "total_tokens": (row["prompt_tokens"] or 0) + (row["completion_tokens"] or 0),
        }
        for row in rows
    ]

