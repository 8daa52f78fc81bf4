"""What the pages show, composed from the tenant-scoped selectors of `tenants`, `registry` and
`audit`.

Every query here starts from one of those selectors, so tenant isolation stays where it
is enforced for the REST API.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import OuterRef, Q, Subquery
from django.utils import timezone

from audit.models import AuditEvent
from audit.selectors import audit_event_list
from registry.models import Adapter, AdapterVersion, Alias
from registry.quality import factors
from registry.selectors import adapter_list, adapter_version_list, alias_list, base_model_default
from registry.services.aliases import alias_target_refusal, canary_refusal
from tenants.usage import usage_totals

from .charts import perplexity_bars

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
    last_day = usage_totals(
        tenant=tenant, start=now - timedelta(hours=24), end=now, by=("adapter",)
    )
    requests = {row["adapter"]: row["requests"] for row in last_day}
    return [
        AdapterRow(
            adapter=a,
            latest=latest.get(a.latest_pk),
            aliases=aliases.get(a.pk, []),
            requests_24h=requests.get(a.name, 0),
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
    base = base_model_default()
    if base is None:
        return PlaygroundModels(base=None)
    # name -> description: the label says what an adapter does ("Answers in French.")
    ready = dict(
        adapter_version_list(tenant=tenant)
        .filter(status=AdapterVersion.READY, adapter__base_model=base)
        .values_list("adapter__name", "adapter__description")
    )
    choices = []
    aliases = alias_list(tenant=tenant)
    for name in sorted(ready):
        label = f"{name}: {ready[name]}" if ready[name] else name
        choices.append(ModelChoice(value=name, label=label))
        for alias in aliases:
            if alias.adapter.name == name:
                choices.append(
                    ModelChoice(
                        value=f"{name}@{alias.name}",
                        label=f"{name}@{alias.name} (v{alias.version.number})",
                    )
                )
    return PlaygroundModels(base=base.name, adapters=choices)


def evaluation_chart(version: AdapterVersion):
    """(its newest evaluation or None, a chart of adapter vs base perplexity or None)."""
    evaluation = version.latest_evaluation
    if evaluation is None or evaluation.adapter_perplexity is None:
        return evaluation, None
    assert evaluation.base_perplexity is not None  # measured together
    max_ratio, _ = factors()
    chart = perplexity_bars(
        evaluation.adapter_perplexity,
        evaluation.base_perplexity,
        reference=evaluation.reference_perplexity,
        max_ratio=max_ratio,
    )
    return evaluation, chart


def alias_move_refusals(adapter: Adapter, version: AdapterVersion) -> tuple[str, str]:
    """(why no alias may point at it, why no canary may) as the server would refuse them,
    each "" when it may: the page disables or hides those buttons, saying why."""
    if version.status != AdapterVersion.READY:
        return "", ""
    refusal = alias_target_refusal(version)
    canary = canary_refusal(adapter, version)
    return (refusal.message if refusal else ""), (canary.message if canary else "")
