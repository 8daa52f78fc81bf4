"""Aliases: moving one is how a rollout, a canary and a rollback happen."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import transaction

from audit.services import Subject, audit_record, snapshot

from .. import queue
from ..announcements import announce_on_commit
from ..errors import (
    CanaryIsProduction,
    EvaluationNotPassed,
    InvalidAlias,
    InvalidWeight,
    RegistryError,
    ReservedAlias,
    UnknownVersion,
    VersionIncompatible,
    VersionNotReady,
    WeightNotAllowed,
)
from ..models import Adapter, AdapterVersion, Alias
from ..names import CANARY, PRODUCTION, alias_name_validator, reserved_alias_reason
from ..quality import why_not_passed


def _audit(alias: Alias, verb: str, *, actor: str, before=None, after=None) -> None:
    adapter = alias.adapter
    subject = Subject(tenant=adapter.tenant, type="alias", name=f"{adapter.name}@{alias.name}")
    audit_record(subject=subject, actor=actor, verb=verb, before=before, after=after)


def _snapshot(alias: Alias | None) -> dict | None:
    if alias is None:
        return None
    return snapshot(alias, "weight", alias=alias.name, version=alias.version.number)


def _check_name(name: str) -> None:
    try:
        alias_name_validator(name)
    except ValidationError as exc:
        raise InvalidAlias(exc.messages[0], param="alias") from None
    reason = reserved_alias_reason(name)
    if reason:
        raise ReservedAlias(reason, param="alias")


def alias_target_refusal(version: AdapterVersion) -> RegistryError | None:
    """Why no alias may point at `version` now (the error an attempt raises), or None.

    The pages ask this to disable what the server would refuse: a version still pending
    validation or evaluation, incompatible with the base model's revision, or failed.
    """
    number = version.number
    if version.status != AdapterVersion.READY:
        why = f": {version.status_detail}" if version.status_detail else ""
        return VersionNotReady(
            f"v{number} is {version.status}{why}; only ready versions can be pointed at",
        )
    base = version.adapter.base_model
    if version.compatible is not True or version.checked_revision != base.revision:
        if version.checked_revision != base.revision:
            why = f"it has not been checked against {base.name}'s current revision yet"
        else:
            why = version.compatibility_detail
        return VersionIncompatible(
            f"v{number} is not compatible with base model {base.name}: {why}",
        )
    why_not = why_not_passed(version, base.revision)
    if why_not is not None:
        return EvaluationNotPassed(
            f"v{number} has not passed its evaluation: {why_not}; only versions that passed "
            "(or that an operator overrode) can be pointed at",
        )
    return None


def canary_refusal(adapter: Adapter, version: AdapterVersion) -> RegistryError | None:
    """A canary must be another version than the one production serves, or None."""
    production = Alias.objects.filter(adapter=adapter, name=PRODUCTION).first()
    if production is None or production.version_id != version.pk:
        return None
    return CanaryIsProduction(
        f"v{version.number} is the version {adapter.name}@{PRODUCTION} already serves; a "
        "canary sends a share of the traffic to another version: pick a different one",
        param="version",
    )


def _pointable(adapter: Adapter, number: int) -> AdapterVersion:
    version = AdapterVersion.objects.filter(adapter=adapter, number=number).first()
    if version is None:
        raise UnknownVersion(
            f"adapter '{adapter.name}' has no version {number}",
            param="version",
        )
    refusal = alias_target_refusal(version)
    if refusal is not None:
        raise refusal
    return version


@transaction.atomic
def alias_set(
    *, adapter: Adapter, name: str, version_number: int, actor: str, weight: int | None = None
) -> tuple[Alias, bool]:
    """Point an alias at a ready, compatible version that passed its evaluation (or that an
    operator overrode) on the base model's current revision; returns (alias, created).

    `weight` (0-100) belongs to the `canary` alias only: that share of requests for the
    bare adapter name goes to the canary's version.
    """
    _check_name(name)
    if weight is not None and name != CANARY:
        raise WeightNotAllowed(
            f"weight applies only to the '{CANARY}' alias",
            param="weight",
        )
    if weight is not None and not 0 <= weight <= 100:
        raise InvalidWeight("weight must be between 0 and 100", param="weight")
    version = _pointable(adapter, version_number)
    if name == CANARY and (refusal := canary_refusal(adapter, version)) is not None:
        raise refusal
    alias = Alias.objects.select_for_update().filter(adapter=adapter, name=name).first()
    before = _snapshot(alias)
    created = alias is None
    if alias is None:
        alias = Alias(adapter=adapter, name=name)
    alias.version = version
    if name == CANARY:
        alias.weight = weight if weight is not None else (alias.weight or 0)
    alias.updated_by = actor
    alias.full_clean()
    alias.save()
    _audit(alias, "alias.set", actor=actor, before=before, after=_snapshot(alias))
    queue.send_on_commit(queue.STAGE, version.pk)  # make sure the target is on local disk
    announce_on_commit(version)  # and on each engine replica's disk
    return alias, created


@transaction.atomic
def alias_delete(*, alias: Alias, actor: str) -> None:
    _audit(alias, "alias.delete", actor=actor, before=_snapshot(alias))
    alias.delete()
