"""Celery tasks: thin, take ids, call a service. Idempotent, acknowledged late (a worker that
dies mid-task leaves the message to be redelivered, and the sweep catches what is still lost),
retried with exponential backoff when object storage or the database fails (evaluations: also
the engine). Any other exception ends the version rejected (an evaluation failed) with an
error id, never stuck in `validating` (or `running`)."""

import logging

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import InterfaceError, OperationalError

from . import queue, staging
from .errors import StorageUnavailable
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


@shared_task(name=queue.VALIDATE, **TASK_OPTIONS)
def validate_adapter_version(self, version_id: int):
    try:
        version = adapter_version_validate(version_id=version_id)
    except StorageUnavailable as exc:
        if self.request.retries >= self.max_retries:
            reason = f"object storage failed {self.request.retries + 1} times: {exc.message}"
            adapter_version_reject(version_id=version_id, reason=reason)
            return "rejected"
        raise self.retry(exc=exc, countdown=backoff(self.request.retries)) from None
    except SoftTimeLimitExceeded:
        reason = f"validation ran past its {settings.TASK_SOFT_TIME_LIMIT} s time limit"
        adapter_version_reject(version_id=version_id, reason=reason)
        return "rejected"
    except (OperationalError, InterfaceError) as exc:  # the database, not the files
        raise self.retry(exc=exc, countdown=backoff(self.request.retries)) from None
    except Exception as exc:
        adapter_version_fail(version_id=version_id, exc=exc)
        return "rejected"
    return version.status if version else "nothing to do"


@shared_task(name=queue.STAGE, **TASK_OPTIONS)
def stage_adapter_version(self, version_id: int):
    try:
        folder = staging.stage_version(version_id=version_id)
    except StorageUnavailable as exc:
        raise self.retry(exc=exc, countdown=backoff(self.request.retries)) from None
    return str(folder) if folder else None


@shared_task(name=queue.RECHECK, **TASK_OPTIONS)
def recheck_compatibility(self, base_model_id: int):
    try:
        return base_model_recheck(base_model_id=base_model_id)
    except StorageUnavailable as exc:
        raise self.retry(exc=exc, countdown=backoff(self.request.retries)) from None


@shared_task(name=queue.EVALUATE, **TASK_OPTIONS)
def evaluate_adapter_version(self, evaluation_id: int):
    """Score a version's eval set on the engine and apply the quality gate. The engine (or
    storage) failing is retried with backoff, the version pending meanwhile; after the
    retries the evaluation, and a version that awaited it, end failed with the reason."""
    try:
        evaluation = evaluation_run(evaluation_id=evaluation_id)
    except (EvaluationUnavailable, StorageUnavailable) as exc:
        message = exc.message if isinstance(exc, StorageUnavailable) else str(exc)
        attempts = self.request.retries + 1
        if self.request.retries >= self.max_retries:
            evaluation_give_up(evaluation_id=evaluation_id, attempts=attempts, why=message)
            return "failed"
        countdown = backoff(self.request.retries)
        evaluation_retrying(
            evaluation_id=evaluation_id,
            reason=f"attempt {attempts} failed ({message}); retrying in {countdown:g} s",
        )
        raise self.retry(exc=exc, countdown=countdown) from None
    except SoftTimeLimitExceeded:
        reason = f"evaluation ran past its {settings.TASK_SOFT_TIME_LIMIT} s time limit"
        evaluation_fail(evaluation_id=evaluation_id, reason=reason)
        return "failed"
    except (OperationalError, InterfaceError) as exc:  # the database, not the engine
        raise self.retry(exc=exc, countdown=backoff(self.request.retries)) from None
    except Exception as exc:
        evaluation_crash(evaluation_id=evaluation_id, exc=exc)
        return "failed"
    return evaluation.status if evaluation else "nothing to do"


@shared_task(name=queue.SWEEP, acks_late=True)
def sweep_stuck_validations():
    counts = versions_sweep_stuck()
    if any(counts.values()):
        log.warning("stuck validations: %s", counts)
    return counts


@shared_task(name=queue.SWEEP_EVALUATIONS, acks_late=True)
def sweep_stuck_evaluations():
    counts = evaluations_sweep_stuck()
    if any(counts.values()):
        log.warning("stuck evaluations: %s", counts)
    return counts
