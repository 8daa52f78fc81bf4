"""Celery tasks: thin, take ids, call a service. Idempotent, acknowledged late (a worker that
dies mid-task leaves the message to be redelivered, and the sweep catches what is still lost),
retried with exponential backoff when object storage or the database fails. Evaluations wait
by the clock instead (`Wait`): an engine restarting on new weights comes back by itself, in
minutes. Any other exception ends the version rejected (an evaluation failed) with an error
id, never stuck in `validating` (or `running`). Each kind of work has its own queue
(platform_site/celery.py); evaluations also take turns between tenants (evaluation_turns.py)."""

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import InterfaceError, OperationalError

from . import queue, staging
from .errors import StorageUnavailable
from .models import AdapterVersion, Evaluation
from .services.base_models import base_model_recheck
from .services.evaluation_turns import NotItsTurn
from .services.evaluations import (
    EvaluationCancelled,
    EvaluationUnavailable,
    evaluation_crash,
    evaluation_fail,
    evaluation_give_up,
    evaluation_run,
    evaluation_waiting,
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


MIN_PAUSE_SECONDS = 0.1  # a zero backoff must not spin a worker against a dead engine
WAITING_SINCE = "waiting_since"  # the task's keyword: when its wait began (epoch seconds)


def backoff(retries: int, cap: float | None = None) -> float:
    """Seconds before retry number `retries + 1`: base * 2^retries, capped."""
    cap = settings.TASK_RETRY_BACKOFF_MAX if cap is None else cap
    return min(settings.TASK_RETRY_BACKOFF_SECONDS * 2 ** min(retries, 32), cap)


@dataclass(frozen=True)
class Wait:
    """Retry transient errors for `seconds` since the first one, by the clock, not a count:
    what they wait for (an engine loading a 70B checkpoint) comes back by itself, however
    many tries it takes. Pauses grow as `backoff`, at most `longest` s, so a ready engine is
    used soon. The start travels in the task's message (`WAITING_SINCE`)."""

    seconds: float
    longest: float

    def pause(self, retries: int, left: float) -> float:
        return max(min(backoff(retries, cap=self.longest), left), MIN_PAUSE_SECONDS)

    def tries(self) -> int:
        """The most tries one delivery makes: pauses alone, summed, reach `seconds`."""
        tries, waited = 1, 0.0
        while waited < self.seconds:
            waited += self.pause(tries - 1, self.seconds - waited)
            tries += 1
        return tries


def evaluation_wait() -> Wait:
    """How long an evaluation waits for an engine serving its revision (or for storage)."""
    return Wait(seconds=settings.EVAL_WAIT_SECONDS, longest=settings.EVAL_RETRY_MAX_SECONDS)


def retry_later(
    task, exc: Exception, countdown: float | None = None, *, kwargs: dict | None = None
) -> NoReturn:
    """Hand the message back to run again after the backoff (re-raises `exc` once spent);
    `kwargs` replace the task's keyword arguments in it."""
    wait = backoff(task.request.retries) if countdown is None else countdown
    raise task.retry(exc=exc, countdown=wait, kwargs=kwargs) from None


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
    wait: Wait | None = None,
    postponed: tuple[type[NotItsTurn], ...] = (),
    stopped: tuple[type[Exception], ...] = (),
) -> str:
    """Run a task's `work()` (a service returning a row, or None: nothing to do) under the
    registry's policy, and answer the row's status, or `ended` when a handler ended it.

    `transient` errors are retried with backoff (`retrying(why, attempt, countdown)` told
    first) until the retries are spent, or with `wait` until its time is, then
    `give_up(why, attempts)`; the database failing is always retried, it says nothing about
    the work; past the soft time limit `fail(reason)`; anything else is a bug: `crash(exc)`.
    `postponed` errors run it again after their `countdown`, without counting as a retry's
    wait; `stopped` ones end it "cancelled" (the service recorded why).
    """
    try:
        row = work()
    except postponed as exc:
        retry_later(task, exc, exc.countdown)
    except stopped as exc:
        log.info("%s stopped: %s", what, exc)
        return "cancelled"
    except transient as exc:
        _retry_transient(task, exc, wait=wait, give_up=give_up, retrying=retrying)
        return ended
    except SoftTimeLimitExceeded:
        fail(f"{what} ran past its {settings.TASK_SOFT_TIME_LIMIT} s time limit")
        return ended
    except (OperationalError, InterfaceError) as exc:
        retry_later(task, exc)
    except Exception as exc:
        crash(exc)
        return ended
    return row.status if row is not None else "nothing to do"


def _retry_transient(
    task,
    exc: Exception,
    *,
    wait: Wait | None,
    give_up: Callable[[str, int], object],
    retrying: Callable[[str, int, float], object] | None,
) -> None:
    """Queue the next try (raises Celery's Retry), or `give_up` once the retries or the wait
    are spent."""
    retries = task.request.retries
    kwargs = None
    if wait is None:
        spent = retries >= task.max_retries
        countdown = backoff(retries)
    else:
        now = time.time()
        since = float((task.request.kwargs or {}).get(WAITING_SINCE) or now)
        left = since + wait.seconds - now
        spent = left <= 0
        countdown = wait.pause(retries, left)
        kwargs = {WAITING_SINCE: since}
    if spent:
        give_up(str(exc), retries + 1)
        return
    if retrying is not None:
        retrying(str(exc), retries + 1, countdown)
    retry_later(task, exc, countdown, kwargs=kwargs)


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


@shared_task(name=queue.EVALUATE, **{**TASK_OPTIONS, "max_retries": None})
def evaluate_adapter_version(self, evaluation_id: int, waiting_since: float | None = None):
    """Score a version's eval set on an engine and apply the quality gate. Until an engine
    serving the revision (and storage) answers, it waits (`evaluation_wait()`; its retries
    carry `waiting_since`), the version pending; a refusal no engine would change fails it at
    once, and so does the wait spent. While another of its tenant's evaluations runs, it asks
    again shortly; a deleted or superseded version's evaluation stops between requests."""
    return run_retrying(
        self,
        lambda: evaluation_run(evaluation_id=evaluation_id),
        what="evaluation",
        ended="failed",
        transient=(EvaluationUnavailable, StorageUnavailable),
        wait=evaluation_wait(),
        retrying=lambda why, attempt, countdown: evaluation_waiting(
            evaluation_id=evaluation_id, why=why, attempt=attempt, countdown=countdown
        ),
        give_up=lambda why, attempts: evaluation_give_up(
            evaluation_id=evaluation_id, attempts=attempts, why=why
        ),
        fail=lambda reason: evaluation_fail(evaluation_id=evaluation_id, reason=reason),
        crash=lambda exc: evaluation_crash(evaluation_id=evaluation_id, exc=exc),
        postponed=(NotItsTurn,),
        stopped=(EvaluationCancelled,),
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
    """Each delivery of an evaluation may try as often as its wait allows: the sweep gives up
    after LORAPLEX_VALIDATION_MAX_ATTEMPTS deliveries' worth, not a waiting one's tries."""
    most = settings.VALIDATION_MAX_ATTEMPTS * evaluation_wait().tries()
    return _logged("evaluations", evaluations_sweep_stuck(most_attempts=most))
