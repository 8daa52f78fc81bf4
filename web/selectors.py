"""What the pages show, composed from the tenant-scoped selectors of `tenants` and `registry`.

Every query here starts from one of those selectors (or filters UsageRecord by tenant), so
tenant isolation stays where it is enforced for the REST API.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime, timedelta

from django.db.models import Count, OuterRef, Q, Subquery, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from registry.models import Adapter, AdapterVersion, Alias, AuditEvent
from registry.selectors import (
    adapter_list,
    adapter_version_list,
    alias_list,
    audit_event_list,
    base_model_served,
)
from tenants.models import UsageRecord

TERMINAL = (AdapterVersion.READY, AdapterVersion.REJECTED)


@dataclass
class AdapterRow:
    adapter: Adapter
    latest: AdapterVersion | None
    aliases: list[Alias]
    requests_24h: int


def adapter_rows(*, tenant, now: datetime | None = None) -> list[AdapterRow]:
    """The adapters page: each adapter with its newest version, aliases and last day's requests."""
    now = now or timezone.now()
    newest = AdapterVersion.objects.filter(adapter=OuterRef("pk")).order_by("-number")
    adapters = list(
        adapter_list(tenant=tenant).annotate(latest_pk=Subquery(newest.values("pk")[:1]))
    )
    latest = AdapterVersion.objects.in_bulk([a.latest_pk for a in adapters if a.latest_pk])
    aliases: dict[int, list[Alias]] = {}
    for alias in alias_list(tenant=tenant):
        aliases.setdefault(alias.adapter_id, []).append(alias)
    requests = dict(
        UsageRecord.objects.filter(
            tenant=tenant,
            created_at__gte=now - timedelta(hours=24),
            adapter_version__adapter__tenant=tenant,
        )
        .values_list("adapter_version__adapter_id")
        .annotate(n=Count("id"))
    )
    return [
        AdapterRow(
            adapter=a,
            latest=latest.get(a.latest_pk),
            aliases=aliases.get(a.pk, []),
            requests_24h=requests.get(a.pk, 0),
        )
        for a in adapters
    ]


def adapter_audit_trail(*, tenant, adapter: Adapter, limit: int = 50) -> list[AuditEvent]:
    """Events about the adapter, its versions (`name/vN`) and its aliases (`name@alias`)."""
    name = adapter.name
    events = audit_event_list(tenant=tenant).filter(
        Q(object_type="adapter", object_repr=name)
        | Q(object_type="adapter_version", object_repr__startswith=f"{name}/")
        | Q(object_type="alias", object_repr__startswith=f"{name}@")
    )
    return list(events[:limit])


def rollback_targets(*, tenant, adapter: Adapter, aliases: list[Alias]) -> dict[str, int]:
    """alias name -> the version it pointed at before its last move, if that one is still ready.

    Rolling back is undoing the last move, so the target comes from the audit trail.
    """
    ready = set(
        adapter_version_list(tenant=tenant, adapter_name=adapter.name)
        .filter(status=AdapterVersion.READY)
        .values_list("number", flat=True)
    )
    targets = {}
    for alias in aliases:
        last_move = (
            audit_event_list(tenant=tenant, verb="alias.set")
            .filter(object_type="alias", object_repr=f"{adapter.name}@{alias.name}")
            .first()
        )
        before = (last_move.before or {}).get("version") if last_move else None
        if before and before != alias.version.number and before in ready:
            targets[alias.name] = before
    return targets


@dataclass
class ModelChoice:
    value: str
    label: str


@dataclass
class PlaygroundModels:
    base: str | None
    adapters: list[ModelChoice] = field(default_factory=list)


def playground_models(*, tenant) -> PlaygroundModels:
    """What a member can pick: adapters with a ready version (and their aliases), or the base."""
    base = base_model_served()
    if base is None:
        return PlaygroundModels(base=None)
    ready = set(
        adapter_version_list(tenant=tenant)
        .filter(status=AdapterVersion.READY, adapter__base_model=base)
        .values_list("adapter__name", flat=True)
    )
    choices = []
    aliases = alias_list(tenant=tenant)
    for name in sorted(ready):
        choices.append(ModelChoice(value=name, label=name))
        for alias in aliases:
            if alias.adapter.name == name:
                choices.append(
                    ModelChoice(
                        value=f"{name}@{alias.name}",
                        label=f"{name}@{alias.name} (v{alias.version.number})",
                    )
                )
    return PlaygroundModels(base=base.name, adapters=choices)


@dataclass
class UsageRow:
    day: date
    adapter: str
    requests: int
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def usage_by_day_and_adapter(*, tenant, start: datetime, end: datetime) -> list[UsageRow]:
    """Tokens per UTC day per adapter in [start, end).

    Requests that ran an adapter version count for that adapter, whatever alias or version
    the client named; the others (the base model) count under the model name they sent.
    """
    grouped = (
        UsageRecord.objects.filter(tenant=tenant, created_at__gte=start, created_at__lt=end)
        .annotate(day=TruncDate("created_at"))
        .values("day", "adapter_version__adapter__name", "model")
        .annotate(
            requests=Count("id"),
            prompt=Sum("prompt_tokens"),
            completion=Sum("completion_tokens"),
        )
    )
    merged: dict[tuple[date, str], UsageRow] = {}
    for row in grouped:
        label = row["adapter_version__adapter__name"] or row["model"]
        key = (row["day"], label)
        if key not in merged:
            merged[key] = UsageRow(
                day=row["day"], adapter=label, requests=0, prompt_tokens=0, completion_tokens=0
            )
        merged[key].requests += row["requests"]
        merged[key].prompt_tokens += row["prompt"] or 0
        merged[key].completion_tokens += row["completion"] or 0
    return [merged[key] for key in sorted(merged)]
