"""Reads. Tenant isolation lives here, once per model: every tenant-owned query starts from a
`*_list(*, tenant)` selector, and another tenant's object is a 404 identical to a missing one.

The serving layer reads through the selectors below `adapter_version_resolve` too, and
stages through `registry.staging.ensure_staged`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from django.db.models import Count, QuerySet
from django.http import Http404

from .errors import NotServable
from .models import Adapter, AdapterVersion, Alias, BaseModel, EvalSet
from .names import CANARY, LATEST, PRODUCTION, version_number_of_alias
from .quality import why_not_passed

# ---------------------------------------------------------------- base models (not tenant-owned)


def base_model_list() -> QuerySet[BaseModel]:
    return BaseModel.objects.all()


def base_model_get(*, name: str) -> BaseModel:
    try:
        return BaseModel.objects.get(name=name)
    except BaseModel.DoesNotExist:
        raise Http404("No such base model.") from None


def base_model_find(*, name: str) -> BaseModel | None:
    return BaseModel.objects.filter(name=name).first()


def base_model_names() -> list[str]:
    return list(BaseModel.objects.order_by("name").values_list("name", flat=True))


def base_model_default() -> BaseModel | None:
    """The base model adapters are created on when none is named, and that `serve` runs
    without LORAPLEX_BASE_MODEL."""
    return BaseModel.objects.filter(is_default=True).first()


@dataclass(frozen=True)
class QualityProgress:
    """A base model's adapter versions by quality on its current revision: how far the
    re-evaluation after an upgrade has come, and which versions it found degraded."""

    revision: str
    counts: dict[str, int]  # every quality state, ready versions only
    degraded: list[AdapterVersion]  # degraded or failed there, most recent verdict first

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def done(self) -> int:
        """Versions with a verdict on the current revision."""
        Quality = AdapterVersion.Quality
        return self.total - self.counts[Quality.PENDING] - self.counts[Quality.UNEVALUATED]


def quality_progress(*, base_model: BaseModel, limit: int = 200) -> QualityProgress:
    """For operators (the admin): not tenant-scoped."""
    ready = AdapterVersion.objects.filter(
        adapter__base_model=base_model, status=AdapterVersion.READY
    )
    per_state = ready.order_by().values("quality").annotate(n=Count("pk"))
    found = {row["quality"]: row["n"] for row in per_state}
    counts = {state: found.get(state, 0) for state in AdapterVersion.Quality.values}
    Quality = AdapterVersion.Quality
    degraded = list(
        ready.filter(
            quality__in=[Quality.DEGRADED, Quality.FAILED], quality_revision=base_model.revision
        )
        .select_related("adapter__tenant")
        .order_by("-pk")[:limit]
    )
    return QualityProgress(base_model.revision, counts, degraded)


# ---------------------------------------------------------------- tenant-owned


def adapter_list(*, tenant) -> QuerySet[Adapter]:
    return Adapter.objects.filter(tenant=tenant).select_related("base_model", "tenant")


def adapter_get(*, tenant, name: str) -> Adapter:
    try:
        return adapter_list(tenant=tenant).get(name=name)
    except Adapter.DoesNotExist:
        raise Http404("No such adapter.") from None


def adapter_version_list(*, tenant, adapter_name: str | None = None) -> QuerySet[AdapterVersion]:
    versions = AdapterVersion.objects.filter(adapter__tenant=tenant).select_related(
        "adapter__base_model", "adapter__tenant"
    )
    if adapter_name is not None:
        versions = versions.filter(adapter__name=adapter_name)
    return versions.order_by("adapter__name", "-number")


def adapter_version_get(*, tenant, adapter_name: str, number) -> AdapterVersion:
    try:
        return adapter_version_list(tenant=tenant, adapter_name=adapter_name).get(
            number=int(number)
        )
    except (AdapterVersion.DoesNotExist, ValueError, TypeError):
        raise Http404("No such adapter version.") from None


def alias_list(*, tenant, adapter_name: str | None = None) -> QuerySet[Alias]:
    aliases = Alias.objects.filter(adapter__tenant=tenant).select_related(
        "version", "adapter__tenant", "adapter__base_model"
    )
    if adapter_name is not None:
        aliases = aliases.filter(adapter__name=adapter_name)
    return aliases.order_by("adapter__name", "name")


def alias_get(*, tenant, adapter_name: str, name: str) -> Alias:
    try:
        return alias_list(tenant=tenant, adapter_name=adapter_name).get(name=name)
    except Alias.DoesNotExist:
        raise Http404("No such alias.") from None


# ---------------------------------------------------------------- eval sets


def eval_set_for(target: Adapter | AdapterVersion) -> EvalSet | None:
    """The set an adapter (or a version of it) is measured on: its own, else its base model's
    generic one, else None."""
    adapter = target.adapter if isinstance(target, AdapterVersion) else target
    sets = EvalSet.objects.filter(is_current=True).select_related("adapter", "base_model")
    return (
        sets.filter(adapter=adapter).first()
        or sets.filter(base_model_id=adapter.base_model_id).first()
    )


# ---------------------------------------------------------------- serving


def _latest_servable(adapter: Adapter, base: BaseModel) -> AdapterVersion:
    versions = adapter_version_list(tenant=adapter.tenant, adapter_name=adapter.name)
    for version in versions.filter(
        status=AdapterVersion.READY,
        compatible=True,
        checked_revision=base.revision,
        quality__in=AdapterVersion.SERVABLE_QUALITY,
        quality_revision=base.revision,
    )[:1]:
        return version
    newest = versions.filter(status=AdapterVersion.READY).first()
    if newest is None:
        raise NotServable(f"adapter '{adapter.name}' has no ready version for {base.name} yet")
    raise NotServable(
        f"adapter '{adapter.name}' has no servable version for {base.name}; the newest ready "
        f"one, {_why_not(newest, base)}"
    )


def _why_not(version: AdapterVersion, base: BaseModel) -> str:
    if version.status != AdapterVersion.READY:
        return f"{version.label} is {version.status}"
    if version.checked_revision != base.revision:
        return f"{version.label} has not been checked against {base.name}'s current revision"
    if version.compatible is not True:
        return f"{version.label} does not fit {base.name}: {version.compatibility_detail}"
    return f"{version.label}: {why_not_passed(version, base.revision)}"


def adapter_version_resolve(
    *,
    tenant,
    adapter_name: str,
    alias: str | None = None,
    number: int | None = None,
    roll: float | None = None,
) -> AdapterVersion:
    """The version a request for `<adapter>`, `<adapter>@<alias>` or `<adapter>:<n>` runs.

    The bare name follows `production` (or, without one, the newest ready version), and a
    `canary` alias with weight w takes w% of those requests (`roll` in [0, 1) decides; random
    by default). Unknown or foreign names raise Http404; a version that exists but may not
    be served (not ready, not checked compatible with its base model's current revision, or
    its evaluation there pending, degraded or failed) raises NotServable saying why. Never
    returns a version its base model cannot run; which replica runs that base model is the
    caller's business (inference/resolution.py).
    """
    adapter = adapter_get(tenant=tenant, name=adapter_name)
    base = adapter.base_model
    if alias is not None and (alias_number := version_number_of_alias(alias)) is not None:
        alias, number = None, alias_number
    if number is not None:
        version = adapter_version_get(tenant=tenant, adapter_name=adapter_name, number=number)
    elif alias == LATEST:
        version = _latest_servable(adapter, base)
    elif alias is not None:
        version = alias_get(tenant=tenant, adapter_name=adapter_name, name=alias).version
    else:
        aliases = {a.name: a for a in alias_list(tenant=tenant, adapter_name=adapter_name)}
        production, canary = aliases.get(PRODUCTION), aliases.get(CANARY)
        roll = random.random() if roll is None else roll
        if (
            canary
            and canary.weight
            and roll * 100 < canary.weight
            and canary.version.servable_on(base)
        ):
            return canary.version
        version = production.version if production else _latest_servable(adapter, base)
    if not version.servable_on(base):
        raise NotServable(_why_not(version, base))
    return version


# ------------------------------------------------------- the engines' reads (not tenant-scoped)


def version_find_by_uid(*, uid) -> AdapterVersion | None:
    """For operators and the engines' loaders, which name versions by uid: never a tenant's
    request (those resolve model names through adapter_version_resolve)."""
    return (
        AdapterVersion.objects.select_related("adapter__tenant", "adapter__base_model")
        .filter(uid=uid)
        .first()
    )


def adapters_with_ready_versions(*, tenant) -> QuerySet[Adapter]:
    """The tenant's adapters that have a ready version: the ones a model list names."""
    ready = AdapterVersion.objects.filter(adapter__tenant=tenant, status=AdapterVersion.READY)
    return adapter_list(tenant=tenant).filter(id__in=ready.values("adapter_id"))


def aliased_ready_version_uids(*, base_model_name: str) -> list[str]:
    """Versions of this base some alias points at: what traffic is about to ask for."""
    uids = (
        AdapterVersion.objects.filter(
            aliases__isnull=False,
            status=AdapterVersion.READY,
            adapter__base_model__name=base_model_name,
        )
        .values_list("uid", flat=True)
        .distinct()
    )
    return [uid.hex for uid in uids]
