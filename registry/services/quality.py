"""An adapter version's quality: which moves are allowed, and the functions that make them.

Like `transitions.py` for the status: every move happens under a row lock, is checked against
ALLOWED and, when it is a verdict or an override, is audited with the quality before and
after. The verdict itself (the figures against the factors) is registry/quality.py's.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import transaction

from ..errors import InvalidTransition
from ..models import AdapterVersion, BaseModel
from .transitions import locked_version, set_changes, version_audit

Quality = AdapterVersion.Quality

ALLOWED: dict[str, set[str]] = {
    # pending: validation found it ready, or its eval set came; the rest: decided at once
    # (nothing to measure on, or no reference to measure against)
    Quality.UNEVALUATED: {Quality.PENDING, Quality.PASSED, Quality.DEGRADED, Quality.FAILED},
    Quality.PENDING: {Quality.PENDING, Quality.PASSED, Quality.DEGRADED, Quality.FAILED},
    # pending: a new base revision; the others: a re-run's verdict
    Quality.PASSED: {Quality.PENDING, Quality.PASSED, Quality.DEGRADED, Quality.FAILED},
    # overridden: an operator lets it serve on this revision; the rest as above
    Quality.DEGRADED: {
        Quality.PENDING,
        Quality.PASSED,
        Quality.DEGRADED,
        Quality.FAILED,
        Quality.OVERRIDDEN,
    },
    Quality.FAILED: {
        Quality.PENDING,
        Quality.PASSED,
        Quality.DEGRADED,
        Quality.FAILED,
        Quality.OVERRIDDEN,
    },
    # until the next base revision (pending; failed: it does not fit that one), or a re-run
    # that passes
    Quality.OVERRIDDEN: {Quality.PENDING, Quality.PASSED, Quality.FAILED, Quality.OVERRIDDEN},
}
# Versions a new base revision puts back to pending (everything that may move there).
REEVALUATED = [q for q, moves in ALLOWED.items() if Quality.PENDING in moves]


def quality_snapshot(version: AdapterVersion, **extra) -> dict:
    return {
        "quality": version.quality,
        "revision": version.quality_revision,
        "detail": version.quality_detail,
        **extra,
    }


def quality_move(
    version_id: int,
    to: str,
    *,
    revision: str,
    detail: str | Callable[[AdapterVersion], str],
    actor: str,
    verb: str | None,
    when: Callable[[AdapterVersion], bool] | None = None,
    audit_extra: dict | None = None,
    **changes,
) -> AdapterVersion | None:
    """Move a version's quality to `to` on base revision `revision`, saying why (`detail`).

    Audited as `verb` (None: not), `audit_extra` added to the after-state (the figures).
    `detail` and each change may be a function of the locked row.
    Returns None, changing nothing, when the version is gone or `when(version)` is false on
    the locked row. A move ALLOWED does not list raises InvalidTransition (a 409).
    """
    with transaction.atomic():
        version = locked_version(version_id, when)
        if version is None:
            return None
        if to not in ALLOWED[version.quality]:
            raise InvalidTransition(
                f"{version.label}'s quality is {version.quality}; it may become "
                f"{', '.join(sorted(ALLOWED[version.quality]))}, not {to}"
            )
        before = quality_snapshot(version)
        changed = set_changes(version, {**changes, "quality_detail": detail})
        version.quality, version.quality_revision = to, revision
        version.save(update_fields=["quality", "quality_revision", *changed])
        after = quality_snapshot(version, **(audit_extra or {}))
        version_audit(version, actor=actor, verb=verb, before=before, after=after)
        return version


def quality_mark_pending(*, base_model: BaseModel, detail: str) -> int:
    """Every ready version on `base_model` awaits evaluation on its current revision (not
    servable until then): one update, in the caller's transaction. Returns how many."""
    return AdapterVersion.objects.filter(
        adapter__base_model=base_model, status=AdapterVersion.READY, quality__in=REEVALUATED
    ).update(
        quality=Quality.PENDING,
        quality_revision=base_model.revision,
        quality_detail=detail,
    )
