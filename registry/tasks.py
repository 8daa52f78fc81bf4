"""Celery tasks: thin, take ids, call a service. Idempotent, acknowledged late (a worker that
dies mid-task leaves the message to be redelivered, and the sweep catches what is still lost),
retried with exponential backoff when object storage or the database fails (evaluations: also
the engine). Any other exception ends the version rejected (an evaluation failed) with an
error id, never stuck in `validating` (or `running`)."""

import logging
from collections.abc import Callable
from typing import NoReturn

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import InterfaceError, OperationalError

from . import queue, staging
from .errors import StorageUnavailable
from .models import AdapterVersion, Evaluation
from .services.base_models import base_model_recheck
from .services.evaluations import (
    EvaluationUnavailable,
    evaluation_crash,
    evaluation_fail,
    evaluation_give_up,
    evaluation_retrying,
    evaluation_run,
    evaluations_sweep_stuck,
)
from .services.versions import (
    adapter_version_fail,
    adapter_version_reject,
    adapter_version_validate,
    versions_sweep_stuck,
)

log = logging.getLogger(__name__)

TASK_OPTIONS = {
    "bind": True,
    "acks_late": True,
    "reject_on_worker_lost": True,
    "max_retries": settings.TASK_RETRIES,
    "soft_time_limit": settings.TASK_SOFT_TIME_LIMIT,
    "time_limit": settings.TASK_SOFT_TIME_LIMIT + 60,
}


def backoff(retries: int) -> float:
    """Seconds before retry number `retries + 1`: base * 2^retries, capped."""
    return min(settings.TASK_RETRY_BACKOFF_SECONDS * 2**retries, settings.TASK_RETRY_BACKOFF_MAX)


def retry_later(task, exc: Exception, countdown: float | None = None) -> NoReturn:
    """Hand the message back to run again after the backoff (re-raises `exc` once spent)."""
    wait = backoff(task.request.retries) if countdown is None else countdown
    raise task.retry(exc=exc, countdown=wait) from None


def run_retrying(
    task,
    work: Callable[[], AdapterVersion | Evaluation | None],
    *,
    what: str,
    ended: str,
    transient: tuple[type[Exception], ...],
    give_up: Callable[[str, int], object],
    fail: Callable[[str], object],
    crash: Callable[[Exception], object],
    retrying: Callable[[str, int, float], object] | None = None,
) -> str:
    """Run a task's `work()` (a service returning a row, or None: nothing to do) under the
    registry's policy, and answer the row's status, or `ended` when a handler ended it.

    `transient` errors are retried with backoff (`retrying(why, attempt, countdown)` told
    first) until the retries are spent, then `give_up(why, attempts)`; the database failing
    is always retried, it says nothing about the work; past the soft time limit
    `fail(reason)`; anything else is a bug: `crash(exc)`.
    """
    try:
        row = work()
    except transient as exc:
        attempts = task.request.retries + 1
        if task.request.retries >= task.max_retries:
            give_up(str(exc), attempts)
            return ended
        countdown = backoff(task.request.retries)
        if retrying is not None:
            retrying(str(exc), attempts, countdown)
        retry_later(task, exc, countdown)
    except SoftTimeLimitExceeded:
        fail(f"{what} ran past its {settings.TASK_SOFT_TIME_LIMIT} s time limit")
        return ended
    except (OperationalError, InterfaceError) as exc:
        retry_later(task, exc)
    except Exception as exc:
        crash(exc)
        return ended
    return row.status if row is not None else "nothing to do"


@shared_task(name=queue.VALIDATE, **TASK_OPTIONS)
def validate_adapter_version(self, version_id: int):
    def reject(reason: str) -> None:
        adapter_version_reject(version_id=version_id, reason=reason)

    return run_retrying(
        self,
        lambda: adapter_version_validate(version_id=version_id),
        what="validation",
        ended="rejected",
        transient=(StorageUnavailable,),
        give_up=lambda why, attempts: reject(f"object storage failed {attempts} times: {why}"),
        fail=reject,
        crash=lambda exc: adapter_version_fail(version_id=version_id, exc=exc),
    )


@shared_task(name=queue.STAGE, **TASK_OPTIONS)
def stage_adapter_version(self, version_id: int):
    try:
        folder = staging.stage_version(version_id=version_id)
    except StorageUnavailable as exc:
        retry_later(self, exc)
    return str(folder) if folder else None


@shared_task(name=queue.RECHECK, **TASK_OPTIONS)
def recheck_compatibility(self, base_model_id: int):
    try:
        return base_model_recheck(base_model_id=base_model_id)
    except StorageUnavailable as exc:
        retry_later(self, exc)


@shared_task(name=queue.EVALUATE, **TASK_OPTIONS)
def evaluate_adapter_version(self, evaluation_id: int):
    """Score a version's eval set on the engine and apply the quality gate. The engine (or
    storage) failing is retried with backoff, the version pending meanwhile; after the
    retries the evaluation, and a version that awaited it, end failed with the reason."""
    return run_retrying(
        self,
        lambda: evaluation_run(evaluation_id=evaluation_id),
        what="evaluation",
        ended="failed",
        transient=(EvaluationUnavailable, StorageUnavailable),
        retrying=lambda why, attempt, countdown: evaluation_retrying(
            evaluation_id=evaluation_id,
            reason=f"attempt {attempt} failed ({why}); retrying in {countdown:g} s",
        ),
        give_up=lambda why, attempts: evaluation_give_up(
            evaluation_id=evaluation_id, attempts=attempts, why=why
        ),
        fail=lambda reason: evaluation_fail(evaluation_id=evaluation_id, reason=reason),
        crash=lambda exc: evaluation_crash(evaluation_id=evaluation_id, exc=exc),
    )


def _logged(stuck: str, counts: dict[str, int]) -> dict[str, int]:
    """A sweep's counts, logged when it found anything stuck."""
    if any(counts.values()):
        log.warning("stuck %s: %s", stuck, counts)
    return counts


@shared_task(name=queue.SWEEP, acks_late=True)
def sweep_stuck_validations():
    return _logged("validations", versions_sweep_stuck())


@shared_task(name=queue.SWEEP_EVALUATIONS, acks_late=True)
def sweep_stuck_evaluations():
    return _logged("evaluations", evaluations_sweep_stuck())
