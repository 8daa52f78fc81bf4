"""Evaluations: measure a version on its eval set through the engine, then apply the gate.

A version is evaluated when validation finds it ready, when it fits a new revision of its
base model (most-used versions first), when an eval set arrives for one accepted unmeasured,
and when an operator re-runs it: each time an `Evaluation` row, queued for the worker. Until
an engine serving its revision answers (a base upgrade restarts every engine, which takes
minutes on a large base) the task waits and the version stays pending, saying so, so the gate
never lets a version through unjudged; what no engine could measure is decided at once.
"""

from __future__ import annotations

import logging
import math
import tempfile
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from audit.services import SYSTEM_EVALUATOR

from .. import objectstore, queue
from ..engines import SCORE_TIMEOUT_SECONDS, ScoringFailed, merge_answers, score_on_engine
from ..errors import InvalidTransition, ObjectMissing, UploadTooLarge
from ..eval_sets import EvalRow, parse_eval_set
from ..models import AdapterVersion, BaseModel, EvalSet, Evaluation
from ..quality import factors, figure, short_revision, verdict
from ..selectors import eval_set_for
from ..staging import StagingError
from .evaluation_turns import NotItsTurn, lock_tenant, running_for_tenant, tenant_of
from .failures import log_unexpected
from .quality import quality_move
from .transitions import locked_version

log = logging.getLogger(__name__)
Status = Evaluation.Status
Trigger = Evaluation.Trigger
Quality = AdapterVersion.Quality
USAGE_WINDOW = timedelta(days=30)  # "most used" for the order of re-evaluations
# Rows to a scoring request: the engine's rows in flight at once (inference/operator/scoring.py
# scores 8 at a time), so that a deleted or superseded version's scoring stops within one.
SCORE_CHUNK_ROWS = 8


class EvaluationUnavailable(Exception):
    """Nothing could measure the version yet (no engine answering, one restarting, or still
    on the old revision): the task waits and tries again. The version stays pending."""


class EvaluationCancelled(Exception):
    """The evaluation stopped while scoring: its version (or adapter) was deleted, or it was
    superseded (then it is recorded failed, the version's quality untouched). The rows left
    are not sent."""


# ---------------------------------------------------------------- requesting


def _evaluable(version: AdapterVersion, base: BaseModel) -> bool:
    """Ready and checked compatible with the base model's current revision: the engine
    serving that revision can score it."""
    return (
        version.status == AdapterVersion.READY
        and version.compatible is True
        and version.checked_revision == base.revision
    )


def _may_set_reference(version: AdapterVersion, revision: str) -> bool:
    """No reference yet, and `revision` is the one it was accepted on (or it has none yet):
    a figure measured now is what the version was accepted with."""
    return version.reference_evaluation_id is None and version.accepted_revision in ("", revision)


def _servable_quality(version: AdapterVersion, revision: str) -> bool:
    return (
        version.quality in AdapterVersion.SERVABLE_QUALITY and version.quality_revision == revision
    )


def evaluation_request(*, version_id: int, trigger: str, actor: str) -> Evaluation | None:
    """Queue an evaluation of a version on its base model's current revision.

    None when the version is gone or not evaluable there (not ready, or not checked against
    that revision: the compatibility re-check requests it once it is). An evaluation already
    queued or running for that revision is returned as it is. The version's quality becomes
    pending, unless it already passed (or was overridden) on that revision: a re-run does not
    take a servable version off the air. Without an eval set, or without a reference figure
    to hold it to, it is decided at once.
    """
    with transaction.atomic():
        version = locked_version(version_id)
        if version is None:
            return None
        base = version.adapter.base_model
        if not _evaluable(version, base):
            return None
        revision = base.revision
        active = version.evaluations.filter(
            status__in=[Status.QUEUED, Status.RUNNING], base_revision=revision
        ).first()
        if active is not None:
            return active
        reference = version.reference_evaluation
        # Figures compare only on the same rows: the set the reference was measured on first.
        eval_set = reference.eval_set if reference is not None else eval_set_for(version)
        evaluation = Evaluation(
            version=version,
            eval_set=eval_set,
            eval_set_sha256=eval_set.sha256 if eval_set is not None else "",
            base_revision=revision,
            base_quantization=base.quantization,
            trigger=trigger,
            requested_by=actor,
        )
        if reference is None and not _may_set_reference(version, revision):
            return _decide_unmeasurable(version, evaluation)
        if eval_set is None:
            return _decide_unmeasured(version, evaluation)
        evaluation.full_clean()
        evaluation.save()
        if not _servable_quality(version, revision):
            quality_move(
                version.pk,
                Quality.PENDING,
                revision=revision,
                detail=f"evaluation pending on revision {short_revision(revision)}",
                actor=actor,
                verb=None,
            )
        queue.send_on_commit(queue.EVALUATE, evaluation.pk)
        return evaluation


def _decided_now(evaluation: Evaluation, status: str, reason: str) -> Evaluation:
    now = timezone.now()
    evaluation.status, evaluation.reason = status, reason
    evaluation.started_at = evaluation.finished_at = now
    evaluation.duration_seconds = 0.0
    evaluation.full_clean()
    evaluation.save()
    return evaluation


def _decide_unmeasured(version: AdapterVersion, evaluation: Evaluation) -> Evaluation:
    """The first evaluation, with no eval set anywhere: passed, saying nothing was measured
    (an adapter needs no eval set to serve, but a later base upgrade has no figure to hold
    it to)."""
    base = version.adapter.base_model
    reason = (
        f"passed on revision {short_revision(evaluation.base_revision)} unmeasured: there is no "
        f"eval set (neither the adapter's own nor {base.name}'s generic one), so nothing was "
        "scored and a later base model upgrade has no figure to hold it to; attach an eval set "
        f"(PUT /api/v1/adapters/{version.adapter.name}/eval-set/) to have it measured"
    )
    _decided_now(evaluation, Status.PASSED, reason)
    _apply(version.pk, evaluation, Quality.PASSED)
    return evaluation


def _decide_unmeasurable(version: AdapterVersion, evaluation: Evaluation) -> Evaluation:
    """Not its first revision, and no reference figure: nothing to hold it to. Failed until
    an operator overrides it: a base upgrade is what the gate is for, and unmeasured is not
    passed."""
    reason = (
        f"evaluation failed on revision {short_revision(evaluation.base_revision)}: no reference "
        f"figure; {version.label} was accepted on revision "
        f"{short_revision(version.accepted_revision)} without being measured (it had no eval "
        "set), so its quality on this revision cannot be judged; an operator may override "
        "this, or upload a new version"
    )
    _decided_now(evaluation, Status.FAILED, reason)
    keep = _servable_quality(version, evaluation.base_revision)  # an operator's override
    _apply(version.pk, evaluation, version.quality if keep else Quality.FAILED, keep=keep)
    return evaluation


def versions_measure_unmeasured(*, eval_set: EvalSet, actor: str) -> int:
    """A new eval set: measure the versions it applies to that were accepted unmeasured on
    the current revision (their first figure becomes their reference). Returns how many."""
    versions = AdapterVersion.objects.filter(
        status=AdapterVersion.READY, compatible=True, reference_evaluation__isnull=True
    )
    if eval_set.adapter_id is not None:
        versions = versions.filter(adapter_id=eval_set.adapter_id)
    else:  # the generic set: adapters on that base model without their own
        own = EvalSet.objects.filter(adapter__isnull=False, is_current=True).values("adapter_id")
        versions = versions.filter(adapter__base_model_id=eval_set.base_model_id).exclude(
            adapter_id__in=own
        )
    requested = 0
    for version in versions.select_related("adapter__base_model"):
        revision = version.adapter.base_model.revision
        if version.checked_revision == revision and _may_set_reference(version, revision):
            requested += (
                evaluation_request(version_id=version.pk, trigger=Trigger.EVAL_SET, actor=actor)
                is not None
            )
    return requested


def evaluations_rerun(*, versions, actor: str) -> list[Evaluation]:
    """An operator's re-run (admin action, `manage.py evaluate_versions`)."""
    requested = []
    for version in versions:
        evaluation = evaluation_request(version_id=version.pk, trigger=Trigger.RERUN, actor=actor)
        if evaluation is not None:
            requested.append(evaluation)
    return requested


# ---------------------------------------------------------------- running (the worker's task)


def _start(evaluation_id: int) -> Evaluation | None:
    """Mark it running, its tenant's turn taken (evaluation_turns.py); None when there is
    nothing to do. Raises NotItsTurn while another of the tenant's evaluations runs."""
    tenant_id = tenant_of(evaluation_id)
    if tenant_id is None:
        return None
    with transaction.atomic():
        lock_tenant(tenant_id)  # the tenant first, as uploads lock it: one order, no deadlock
        evaluation = (
            Evaluation.objects.select_for_update(of=("self",))
            .select_related("version__adapter__tenant", "version__adapter__base_model", "eval_set")
            .filter(pk=evaluation_id)
            .first()
        )
        if evaluation is None or evaluation.status in Evaluation.FINISHED:
            return None
        running = running_for_tenant(tenant_id=tenant_id, other_than=evaluation.pk)
        # Its message is alive: stamped, so that the sweep does not queue it a second time.
        evaluation.started_at = timezone.now()
        if running is None:
            evaluation.status = Status.RUNNING
            evaluation.attempts += 1
        evaluation.save(update_fields=["status", "attempts", "started_at"])
    if running is not None:
        raise NotItsTurn(
            f"evaluation {evaluation_id} waits for its tenant's evaluation {running.pk} to end"
        )
    return evaluation


def _superseded(evaluation: Evaluation) -> str | None:
    version = AdapterVersion.objects.select_related("adapter__base_model").get(
        pk=evaluation.version_id
    )
    base = version.adapter.base_model
    if base.revision != evaluation.base_revision:
        return f"superseded: {base.name} is now at revision {short_revision(base.revision)}"
    if not _evaluable(version, base):
        return f"superseded: {version.label} is no longer checked compatible with this revision"
    if evaluation.eval_set is None:  # only decided-at-once evaluations have none
        return "superseded: there is no eval set to measure on"
    return None


def eval_set_rows(eval_set: EvalSet) -> list[EvalRow]:
    """The stored set's rows, its bytes checked against the recorded sha256.

    Parsed under the limits the set was accepted with, so lowering LORAPLEX_EVAL_MAX_* later
    does not break sets already stored. Raises StorageUnavailable (retry), ObjectMissing, or
    StagingError when the stored bytes are not the ones recorded.
    """
    with tempfile.TemporaryDirectory(prefix="loraplex-eval-set-") as tmp:
        path = Path(tmp) / "rows.jsonl"
        try:
            digest = objectstore.fetch(eval_set.key, path, limit=eval_set.size)
        except UploadTooLarge:
            digest = None
        if digest is None or digest.sha256 != eval_set.sha256:
            raise StagingError(
                f"the stored eval set {eval_set.uid} is not the one attached (sha256 "
                f"{eval_set.sha256[:12]}...); attach it again"
            )
        data = path.read_bytes()
    return parse_eval_set(data, max_rows=eval_set.rows, max_bytes=eval_set.size)


def _score_timeout() -> float:
    """Each scoring request's wait, within the task's soft time limit."""
    return float(max(30, min(SCORE_TIMEOUT_SECONDS, settings.TASK_SOFT_TIME_LIMIT - 30)))


def evaluation_run(*, evaluation_id: int) -> Evaluation | None:
    """Measure one queued evaluation and record the verdict; None when there is nothing to do.

    Raises EvaluationUnavailable or StorageUnavailable for the task to retry, NotItsTurn for
    it to ask again shortly, EvaluationCancelled when it stopped scoring. A refusal by the
    engine, or an eval set whose bytes are gone or changed, fails it at once.
    """
    evaluation = _start(evaluation_id)
    if evaluation is None:
        return None
    if (why := _superseded(evaluation)) is not None:
        return _finish_failed(evaluation_id, why, apply=False)
    eval_set = evaluation.eval_set
    assert eval_set is not None  # _superseded says so otherwise
    where = f"on revision {short_revision(evaluation.base_revision)}"
    try:
        rows = eval_set_rows(eval_set)  # StorageUnavailable: the task retries
    except (ObjectMissing, StagingError) as exc:
        return evaluation_fail(
            evaluation_id=evaluation_id,
            reason=f"evaluation failed {where}: the eval set could not be read: {exc.message}",
        )
    try:
        answer = _score_in_chunks(evaluation, [row.to_dict() for row in rows])
    except ScoringFailed as exc:
        # Tenants read the reason: the engines' addresses go to the log, not into it.
        log.warning("evaluation %s: %s", evaluation_id, exc)
        if exc.retryable:
            raise EvaluationUnavailable(exc.without_engines) from None
        return evaluation_fail(
            evaluation_id=evaluation_id, reason=f"evaluation failed {where}: {exc.without_engines}"
        )
    served = answer.get("base_revision")
    if served != evaluation.base_revision:
        raise EvaluationUnavailable(
            f"the engine serves revision {short_revision(str(served or ''))}, not "
            f"{short_revision(evaluation.base_revision)} (restart it on the imported weights)"
        )
    figures = _figures_of(answer)
    if figures is None:
        return evaluation_fail(
            evaluation_id=evaluation_id,
            reason=f"evaluation failed {where}: the engine's answer holds no usable figures",
        )
    return _record(evaluation_id, figures)


def _score_in_chunks(evaluation: Evaluation, rows: list[dict]) -> dict:
    """The engine's answer for every row, SCORE_CHUNK_ROWS to a request, the evaluation
    checked before each (`_check_still_wanted`): a deleted version's scoring stops there."""
    answers = []
    for start in range(0, len(rows), SCORE_CHUNK_ROWS):
        if start:
            _check_still_wanted(evaluation.pk)
        chunk = rows[start : start + SCORE_CHUNK_ROWS]
        answers.append(score_on_engine(evaluation.version.uid, chunk, timeout=_score_timeout()))
    return answers[0] if len(answers) == 1 else merge_answers(answers)


def _check_still_wanted(evaluation_id: int) -> None:
    """Raise EvaluationCancelled when the evaluation should stop scoring: gone (its version
    or adapter deleted), decided by another delivery, or superseded (recorded failed, saying
    why). One the sweep queued again goes on: its figures are recorded by whichever ends
    first."""
    evaluation = Evaluation.objects.select_related("eval_set").filter(pk=evaluation_id).first()
    if evaluation is None:
        raise EvaluationCancelled("its version was deleted")
    if evaluation.status in Evaluation.FINISHED:
        raise EvaluationCancelled(f"it ended {evaluation.status} in another delivery")
    try:
        why = _superseded(evaluation)
    except AdapterVersion.DoesNotExist:  # deleted since the line above
        raise EvaluationCancelled("its version was deleted") from None
    if why is not None:
        _finish_failed(evaluation_id, why, apply=False)
        raise EvaluationCancelled(why)


def _number(value, *, integer: bool = False):
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if integer:
        return value if isinstance(value, int) and value > 0 else None
    return float(value) if math.isfinite(value) else None


def _figures_of(answer: dict) -> dict | None:
    """The engine's totals and rows, checked: None when something is missing or not finite."""
    parts = {}
    for part in ("adapter", "base"):
        totals = answer.get(part)
        if not isinstance(totals, dict):
            return None
        values = (
            _number(totals.get("tokens"), integer=True),
            _number(totals.get("nll")),
            _number(totals.get("perplexity")),
        )
        if any(v is None for v in values):
            return None
        parts[part] = dict(zip(("tokens", "nll", "perplexity"), values, strict=True))
    rows = [
        {key: row.get(key) for key in ("tokens", "adapter_nll", "base_nll")}
        for row in answer.get("rows") or []
        if isinstance(row, dict)
    ]
    return {**parts, "rows": rows}


def _record(evaluation_id: int, figures: dict) -> Evaluation:
    with transaction.atomic():
        evaluation = (
            Evaluation.objects.select_for_update(of=("self",))
            .select_related("version")
            .get(pk=evaluation_id)
        )
        if evaluation.status in Evaluation.FINISHED:
            return evaluation  # another run of the task got here first
        version = locked_version(evaluation.version_id)
        assert version is not None  # the evaluation would have gone with it (CASCADE)
        revision = evaluation.base_revision
        sets_reference = _may_set_reference(version, revision)
        reference = None if sets_reference else version.reference_perplexity
        if reference is None and not sets_reference:  # accepted unmeasured, since upgraded
            evaluation.save()
            return _decide_unmeasurable(version, evaluation)
        adapter, base = figures["adapter"], figures["base"]
        max_ratio, max_base_ratio = factors()
        decided = verdict(
            perplexity=adapter["perplexity"],
            base_perplexity=base["perplexity"],
            reference=reference,
            revision=revision,
            max_ratio=max_ratio,
            max_base_ratio=max_base_ratio,
        )
        evaluation.adapter_tokens, evaluation.base_tokens = adapter["tokens"], base["tokens"]
        evaluation.adapter_nll, evaluation.base_nll = adapter["nll"], base["nll"]
        evaluation.adapter_perplexity = adapter["perplexity"]
        evaluation.base_perplexity = base["perplexity"]
        evaluation.rows = figures["rows"]
        evaluation.reference_perplexity = adapter["perplexity"] if sets_reference else reference
        evaluation.status = Status.PASSED if decided.passed else Status.DEGRADED
        evaluation.reason = decided.reason
        _stamp_finish(evaluation)
        evaluation.save()
        # An operator's override on this revision outlives a re-run that degrades again.
        overridden = version.quality == Quality.OVERRIDDEN and version.quality_revision == revision
        to = (
            Quality.PASSED
            if decided.passed
            else Quality.OVERRIDDEN
            if overridden
            else Quality.DEGRADED
        )
        changes = {"reference_evaluation": evaluation} if sets_reference else {}
        _apply(version.pk, evaluation, to, keep=to == Quality.OVERRIDDEN, **changes)
        return evaluation


def _stamp_finish(evaluation: Evaluation) -> None:
    evaluation.finished_at = timezone.now()
    started = evaluation.started_at or evaluation.finished_at
    evaluation.duration_seconds = (evaluation.finished_at - started).total_seconds()


def evaluation_figures(evaluation: Evaluation) -> dict:
    """What the audit trail and the admin record of an evaluation."""
    return {
        "evaluation": evaluation.pk,
        "status": evaluation.status,
        "base_revision": evaluation.base_revision,
        "eval_set_sha256": evaluation.eval_set_sha256,
        "adapter_perplexity": evaluation.adapter_perplexity,
        "base_perplexity": evaluation.base_perplexity,
        "reference_perplexity": evaluation.reference_perplexity,
        "reason": evaluation.reason,
    }


def _apply(
    version_id: int, evaluation: Evaluation, to: str, *, keep: bool = False, **changes
) -> AdapterVersion | None:
    """Make the verdict the version's quality, audited as `evaluation.<status>`, when it still
    speaks for the version: the newest evaluation, on the revision it is checked against.
    `keep`: the version keeps its quality and the words for it (only the event is recorded)."""

    def current(version: AdapterVersion) -> bool:
        newest = version.evaluations.order_by("-pk").values_list("pk", flat=True).first()
        return newest == evaluation.pk and version.checked_revision == evaluation.base_revision

    return quality_move(
        version_id,
        to,
        revision=evaluation.base_revision,
        detail=(lambda v: v.quality_detail) if keep else evaluation.reason,
        actor=SYSTEM_EVALUATOR,
        verb=f"evaluation.{evaluation.status}",
        when=current,
        audit_extra=evaluation_figures(evaluation),
        accepted_revision=lambda v: v.accepted_revision or evaluation.base_revision,
        **changes,
    )


def _finish_failed(evaluation_id: int, reason: str, *, apply: bool) -> Evaluation | None:
    with transaction.atomic():
        evaluation = (
            Evaluation.objects.select_for_update(of=("self",)).filter(pk=evaluation_id).first()
        )
        if evaluation is None or evaluation.status in Evaluation.FINISHED:
            return evaluation
        evaluation.status, evaluation.reason = Status.FAILED, reason
        _stamp_finish(evaluation)
        evaluation.save()
        if apply:
            version = locked_version(evaluation.version_id)
            assert version is not None
            # A failure to measure does not take a version that passed on this revision off
            # the air (an operator's re-run); one that awaited its verdict fails.
            keep = _servable_quality(version, evaluation.base_revision)
            _apply(version.pk, evaluation, version.quality if keep else Quality.FAILED, keep=keep)
        return evaluation


def evaluation_fail(*, evaluation_id: int, reason: str) -> Evaluation | None:
    """End an evaluation failed (the version, if it awaited it, fails too: not servable)."""
    return _finish_failed(evaluation_id, reason, apply=True)


def evaluation_crash(*, evaluation_id: int, exc: BaseException) -> Evaluation | None:
    """Fail after an unexpected exception: a bug of ours. The traceback is logged under an
    error id that the reason quotes."""
    error_id = log_unexpected(exc, what=f"evaluation {evaluation_id}")
    reason = (
        f"evaluation failed on revision {_revision_of(evaluation_id)}: an internal error "
        f"(error id {error_id}); an operator can re-run it once it is fixed"
    )
    return evaluation_fail(evaluation_id=evaluation_id, reason=reason)


def _revision_of(evaluation_id: int) -> str:
    """The evaluation's base revision, shortened for a reason."""
    found = Evaluation.objects.filter(pk=evaluation_id).values_list("base_revision", flat=True)
    return short_revision(found.first() or "")


def evaluation_give_up(*, evaluation_id: int, attempts: int, why: str) -> Evaluation | None:
    """The task's wait is spent: failed, saying for how long and what the last attempt met."""
    waited = _duration(settings.EVAL_WAIT_SECONDS)
    reason = (
        f"evaluation failed on revision {_revision_of(evaluation_id)}: nothing could measure it "
        f"within {waited} (LORAPLEX_EVAL_WAIT_SECONDS), after {attempts} attempts; the last: "
        f"{why}; an operator can re-run it"
    )
    return evaluation_fail(evaluation_id=evaluation_id, reason=reason)


def _duration(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds >= 120 else f"{seconds:g} s"


@transaction.atomic
def evaluation_waiting(
    *, evaluation_id: int, why: str, attempt: int, countdown: float
) -> Evaluation | None:
    """Back to queued until the next try, saying what this one met; the version, pending,
    says it waits (what a 409 for it repeats). Not audited: nothing was decided."""
    evaluation = (
        Evaluation.objects.select_for_update(of=("self",))
        .filter(pk=evaluation_id, status__in=[Status.QUEUED, Status.RUNNING])
        .first()
    )
    if evaluation is None:
        return None
    revision = evaluation.base_revision
    waiting = f"attempt {attempt}: {why}; next try in {countdown:.3g} s"
    evaluation.status, evaluation.reason = Status.QUEUED, f"waiting to be measured: {waiting}"
    evaluation.save(update_fields=["status", "reason"])

    def awaits_it(version: AdapterVersion) -> bool:
        newest = version.evaluations.order_by("-pk").values_list("pk", flat=True).first()
        return (
            newest == evaluation_id
            and version.quality == Quality.PENDING
            and version.quality_revision == revision
        )

    quality_move(
        evaluation.version_id,
        Quality.PENDING,
        revision=revision,
        detail=(
            f"evaluation pending on revision {short_revision(revision)}: waiting to be measured "
            f"({waiting})"
        ),
        actor=SYSTEM_EVALUATOR,
        verb=None,
        when=awaits_it,
    )
    return evaluation


# ---------------------------------------------------------------- the sweep


def evaluations_sweep_stuck(*, most_attempts: int, now=None) -> dict[str, int]:
    """Queue again evaluations that stopped without a verdict (their message lost, or their
    worker died, waiting or running), silent for LORAPLEX_VALIDATION_DEADLINE_SECONDS since
    their last start (or their creation); fail those that have started `most_attempts` times
    (the task's tries for LORAPLEX_VALIDATION_MAX_ATTEMPTS deliveries)."""
    now = now or timezone.now()
    deadline = now - timedelta(seconds=settings.VALIDATION_DEADLINE_SECONDS)
    stuck = (
        Evaluation.objects.filter(status__in=[Status.QUEUED, Status.RUNNING])
        .filter(Q(started_at__lt=deadline) | Q(started_at__isnull=True, created_at__lt=deadline))
        .values_list("pk", "attempts")
    )
    counts = {"requeued": 0, "failed": 0}
    for pk, attempts in list(stuck):
        if attempts < most_attempts:
            # Marked as started now, so the next sweep waits a full deadline again.
            Evaluation.objects.filter(pk=pk).update(status=Status.QUEUED, started_at=now)
            queue.send_on_commit(queue.EVALUATE, pk)
            counts["requeued"] += 1
        else:
            reason = (
                f"the evaluation started {attempts} times and never finished (its worker died "
                "or ran past its time limit); an operator can re-run it"
            )
            counts["failed"] += evaluation_fail(evaluation_id=pk, reason=reason) is not None
    return counts


# ---------------------------------------------------------------- operators


OVERRIDABLE = (Quality.DEGRADED, Quality.FAILED)


def evaluation_override(*, version: AdapterVersion, actor: str, note: str = "") -> AdapterVersion:
    """Let a degraded (or failed) version serve on its base model's current revision, until
    the next revision or a passing re-run. Audited as `evaluation.override`."""
    base = BaseModel.objects.get(pk=version.adapter.base_model_id)
    revision = base.revision
    where = f"on revision {short_revision(revision)}"

    def overridable(v: AdapterVersion) -> bool:
        return _evaluable(v, base) and v.quality in OVERRIDABLE and v.quality_revision == revision

    previous = version.quality_detail
    note = note.strip()[:500]
    detail = f"overridden by {actor} {where} ({previous})" + (f"; note: {note}" if note else "")
    overridden = quality_move(
        version.pk,
        Quality.OVERRIDDEN,
        revision=revision,
        detail=detail,
        actor=actor,
        verb="evaluation.override",
        when=overridable,
        audit_extra={"note": note, "evaluation": _latest_figures(version)},
        quality_overridden_by=actor[:100],
        quality_overridden_at=timezone.now(),
    )
    if overridden is None:
        version.refresh_from_db()
        if not _evaluable(version, base):
            why = (
                f"it is {version.status} and not checked compatible with revision "
                f"{short_revision(revision)}"
            )
        else:
            why = (
                f"its quality is {version.quality} on revision "
                f"{short_revision(version.quality_revision)}"
            )
        raise InvalidTransition(
            f"{version.label} cannot be overridden: {why}; only a degraded or failed evaluation "
            f"of a compatible version {where} can be"
        )
    return overridden


def _latest_figures(version: AdapterVersion) -> dict | None:
    latest = version.evaluations.order_by("-pk").first()
    return None if latest is None else evaluation_figures(latest)


def describe(evaluation: Evaluation) -> str:
    """One line for people: adapter vs base perplexity, and the verdict."""
    if evaluation.adapter_perplexity is None:
        return evaluation.reason or evaluation.status
    return (
        f"adapter {figure(evaluation.adapter_perplexity)} vs base "
        f"{figure(evaluation.base_perplexity)}: {evaluation.reason}"
    )
