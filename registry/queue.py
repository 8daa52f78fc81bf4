"""Queue the registry's Celery tasks once the surrounding transaction commits.

Tasks are sent by name so that services need not import `tasks` (which imports services);
a task queued before its row is committed would look for a row the worker cannot see yet.
Their results are never read (the rows hold each task's outcome), so a send waits on the
broker alone.

A broker that cannot be reached must not turn a committed change into a 500: the tasks in
RECOVERED are made good without their message (the beat sweeps queue validations and
evaluations again; an engine stages a version it misses), so failing to send one is logged
and the request goes on. Any other task's failure to send is raised to the caller.
"""

import logging

from django.db import transaction
from kombu.exceptions import OperationalError

VALIDATE = "registry.validate_adapter_version"
STAGE = "registry.stage_adapter_version"
RECHECK = "registry.recheck_compatibility"
SWEEP = "registry.sweep_stuck_validations"
EVALUATE = "registry.evaluate_adapter_version"
SWEEP_EVALUATIONS = "registry.sweep_stuck_evaluations"
RECOVERED = frozenset({VALIDATE, EVALUATE, STAGE})
# Short tries at reaching the broker: a request is waiting (Celery's own default, bounded).
PUBLISH_RETRY = {"max_retries": 3, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.2}

log = logging.getLogger(__name__)


def send_on_commit(task_name: str, *args) -> None:
    transaction.on_commit(lambda: send(task_name, *args))


def send(task_name: str, *args) -> None:
    from platform_site.celery import app

    try:
        app.send_task(task_name, args=list(args), ignore_result=True, retry_policy=PUBLISH_RETRY)
    except OperationalError as exc:  # kombu's word for a broker it cannot reach
        if task_name not in RECOVERED:
            raise
        log.warning(
            "could not queue %s%s (the broker is unreachable: %s); the sweep or the engine "
            "makes it good",
            task_name,
            tuple(args),
            exc,
        )
