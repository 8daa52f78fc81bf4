"""Aliases: moving one is how a rollout, a canary and a rollback happen."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import transaction

from .. import queue
from ..audit import audit_record
from ..errors import Conflict, RegistryError
from ..models import Adapter, AdapterVersion, Alias
from ..names import CANARY, alias_name_validator, reserved_alias_reason


def _snapshot(alias: Alias | None) -> dict | None:
    if alias is None:
        return None
    return {"alias": alias.name, "version": alias.version.number, "weight": alias.weight}


def _check_name(name: str) -> None:
    try:
        alias_name_validator(name)
    except ValidationError as exc:
        raise RegistryError(exc.messages[0], code="invalid_alias", param="alias") from None
    reason = reserved_alias_reason(name)
    if reason:
        raise RegistryError(reason, code="reserved_alias", param="alias")


def _pointable(adapter: Adapter, number: int) -> AdapterVersion:
    version = AdapterVersion.objects.filter(adapter=adapter, number=number).first()
    if version is None:
        raise RegistryError(
            f"adapter '{adapter.name}' has no version {number}",
            code="unknown_version",
            param="version",
        )
    if version.status != AdapterVersion.READY:
        why = f": {version.status_detail}" if version.status_detail else ""
        raise Conflict(
            f"v{number} is {version.status}{why}; only ready versions can be pointed at",
            code="version_not_ready",
        )
    base = adapter.base_model
    if not version.servable_on(base):
        if version.checked_revision != base.revision:
            why = f"it has not been checked against {base.name}'s current revision yet"
        else:
            why = version.compatibility_detail
        raise Conflict(
            f"v{number} is not compatible with base model {base.name}: {why}",
            code="version_incompatible",
        )
    return version


@transaction.atomic
def alias_set(
    *, adapter: Adapter, name: str, version_number: int, actor: str, weight: int | None = None
) -> tuple[Alias, bool]:
    """Point an alias at a ready, compatible version; returns (alias, created).

    `weight` (0-100) belongs to the `canary` alias only: that share of requests for the
    bare adapter name goes to the canary's version.
    """
    _check_name(name)
    if weight is not None and name != CANARY:
        raise RegistryError(
            f"weight applies only to the '{CANARY}' alias",
            code="weight_not_allowed",
            param="weight",
        )
    if weight is not None and not 0 <= weight <= 100:
        raise RegistryError(
            "weight must be between 0 and 100", code="invalid_weight", param="weight"
        )
    version = _pointable(adapter, version_number)
    alias = Alias.objects.select_for_update().filter(adapter=adapter, name=name).first()
    before = _snapshot(alias)
    created = alias is None
    if created:
        alias = Alias(adapter=adapter, name=name)
    alias.version = version
    if name == CANARY:
        alias.weight = weight if weight is not None else (alias.weight or 0)
    alias.updated_by = actor
    alias.full_clean()
    alias.save()
    audit_record(
        tenant=adapter.tenant,
        actor=actor,
        verb="alias.set",
        object_type="alias",
        object_repr=f"{adapter.name}@{name}",
        before=before,
        after=_snapshot(alias),
    )
    queue.send_on_commit(queue.STAGE, version.pk)  # make sure the target is on local disk
    return alias, created


@transaction.atomic
def alias_delete(*, alias: Alias, actor: str) -> None:
    before = _snapshot(alias)
    audit_record(
        tenant=alias.adapter.tenant,
        actor=actor,
        verb="alias.delete",
        object_type="alias",
        object_repr=f"{alias.adapter.name}@{alias.name}",
        before=before,
    )
    alias.delete()
