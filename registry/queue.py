"""Queue the registry's Celery tasks once the surrounding transaction commits.

Tasks are sent by name so that services need not import `tasks` (which imports services);
a task queued before its row is committed would look for a row the worker cannot see yet.
"""

from django.db import transaction

VALIDATE = "registry.validate_adapter_version"
STAGE = "registry.stage_adapter_version"
RECHECK = "registry.recheck_compatibility"
SWEEP = "registry.sweep_stuck_validations"
EVALUATE = "registry.evaluate_adapter_version"
SWEEP_EVALUATIONS = "registry.sweep_stuck_evaluations"


def send_on_commit(task_name: str, *args) -> None:
    from platform_site.celery import app

    transaction.on_commit(lambda: app.send_task(task_name, args=list(args)))
