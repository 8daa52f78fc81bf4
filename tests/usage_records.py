"""Usage records made directly, for the pages and APIs that read them (metering itself is
tested through `inference.usage`)."""

from datetime import timedelta

from django.utils import timezone

from tenants.models import UsageRecord


def usage_record(
    tenant, model: str, prompt: int, completion: int, *, version=None, days_ago=0, hours_ago=0
) -> UsageRecord:
    """One metered chat request of `tenant` (on adapter `version`, else the base model),
    made `days_ago` and `hours_ago` before now."""
    return UsageRecord.objects.create(
        tenant=tenant,
        adapter_version=version,
        model=model,
        endpoint="chat.completions",
        prompt_tokens=prompt,
        completion_tokens=completion,
        created_at=timezone.now() - timedelta(days=days_ago, hours=hours_ago),
    )
