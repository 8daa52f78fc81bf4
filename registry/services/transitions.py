"""An adapter version's status: which moves are allowed, and the one function that makes them.

Every move happens under a row lock, is checked against ALLOWED and is audited with the
version's state before and after. Re-validating starts over at pending; nothing leaves ready.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import transaction

from audit.services import Subject, audit_record, snapshot

from ..errors import InvalidTransition
from ..models import AdapterVersion

Status = AdapterVersion.Status

ALLOWED: dict[str, set[str]] = {
    # validating: a run starts; rejected: given up (storage, dead workers); pending: start over
    Status.PENDING: {Status.VALIDATING, Status.REJECTED, Status.PENDING},
    # ready or rejected: the verdict; validating: the sweep re-queues a lost run
    Status.VALIDATING: {Status.READY, Status.REJECTED, Status.VALIDATING, Status.PENDING},
    # Immutable; only what its bytes fit is re-checked when the base model's revision changes.
    Status.READY: {Status.READY},
    Status.REJECTED: {Status.PENDING},
}


def undecided(version: AdapterVersion) -> bool:
    """Neither ready nor rejected yet: validation may still start, finish or be given up on."""
    return version.status in (Status.PENDING, Status.VALIDATING)


def version_subject(version: AdapterVersion) -> Subject:
    return Subject(tenant=version.adapter.tenant, type="adapter_version", name=version.label)


def version_audit(
    version: AdapterVersion, *, actor: str, verb: str | None, before: dict, after: dict
) -> None:
    """Record a move of a version's state as `verb`; None: the move is no event of its own
    (a run starting, a step on the way to the verdict that will be recorded)."""
    if verb is not None:
        audit_record(
            subject=version_subject(version), actor=actor, verb=verb, before=before, after=after
        )


def version_snapshot(version: AdapterVersion) -> dict:
    return snapshot(
        version,
        "number",
        "status",
        "config_sha256",
        "weights_sha256",
        "size",
        "source",
        "attempts",
        "compatible",
        detail=version.status_detail,
        revision=version.checked_revision,
        compatibility=version.compatibility_detail,
    )


def _refusal(version: AdapterVersion, to: str) -> str:
    if version.status == Status.READY:
        return f"{version.label} is ready; a ready version is immutable"
    allowed = ", ".join(sorted(ALLOWED[version.status]))
    return f"{version.label} is {version.status}; it may become {allowed}, not {to}"


def locked_version(
    version_id: int, when: Callable[[AdapterVersion], bool] | None = None
) -> AdapterVersion | None:
    """The version's row locked for the caller's transaction (with its adapter, tenant and
    base model), or None when it is gone or `when(version)` is false on the locked row."""
    version = (
        AdapterVersion.objects.select_for_update(of=("self",))
        .select_related("adapter__tenant", "adapter__base_model")
        .filter(pk=version_id)
        .first()
    )
    if version is None or (when is not None and not when(version)):
        return None
    return version


def set_changes(version: AdapterVersion, changes: dict) -> list[str]:
    """Set each change on the row (a function of the row is called with it); their names."""
    values = {name: v(version) if callable(v) else v for name, v in changes.items()}
    for name, value in values.items():
        setattr(version, name, value)
    return list(values)


def transition(
    version_id: int,
    to: str,
    *,
    actor: str,
    verb: str | None,
    when: Callable[[AdapterVersion], bool] | None = None,
    **changes,
) -> AdapterVersion | None:
    """Move a version to status `to` with the field `changes`; audit it as `verb` (None: don't).

    A change may be a function of the locked row (`attempts=lambda v: v.attempts + 1`).
    Returns None, changing nothing, when the version is gone or `when(version)` is false on
    the locked row: that is how a redelivered task finds its work already done. A move
    ALLOWED does not list raises InvalidTransition (a 409 Conflict).
    """
    with transaction.atomic():
        version = locked_version(version_id, when)
        if version is None:
            return None
        if to not in ALLOWED[version.status]:
            raise InvalidTransition(_refusal(version, to))
        before = version_snapshot(version)
        changed = set_changes(version, changes)
        version.status = to
        version.full_clean(validate_unique=False, validate_constraints=False)
        version.save(update_fields=["status", *changed])
        version_audit(
            version, actor=actor, verb=verb, before=before, after=version_snapshot(version)
        )
        return version
