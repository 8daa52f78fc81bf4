"""Liveness and readiness probes.

/healthz answers as long as the process runs (no dependencies), so an orchestrator restarts
only a hung process; /readyz checks what a request needs, so traffic waits for a dead
database or broker to come back instead of failing.
"""

import logging

from django.db import connection
from django.http import JsonResponse
from django.views.decorators.http import require_GET

from .celery import app as celery_app

logger = logging.getLogger(__name__)
READINESS_CHECKS = {}


def readiness_check(name):
    """Register a check; other apps (the engine host) add theirs the same way."""

    def register(func):
        READINESS_CHECKS[name] = func
        return func

    return register


@readiness_check("database")
def check_database() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


@readiness_check("broker")
def check_broker() -> None:
    with celery_app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, timeout=2)


@require_GET
def healthz(request):
    return JsonResponse({"status": "ok"})


@require_GET
def readyz(request):
    failed = []
    for name, check in READINESS_CHECKS.items():
        try:
            check()
        except Exception:  # any failure means not ready; the log says why
            # The reason can name hosts, users or broker URLs: the log only, never the answer.
            logger.warning("readiness check %r failed", name, exc_info=True)
            failed.append(name)
    if failed:
        return JsonResponse({"status": "unavailable", "failed": failed}, status=503)
    return JsonResponse({"status": "ok", "checks": sorted(READINESS_CHECKS)})
