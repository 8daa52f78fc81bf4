"""Liveness and readiness probes.

/healthz answers as long as the process runs (no dependencies), so an orchestrator restarts
only a hung process; /readyz checks what a request needs, so traffic waits for a dead
database or broker to come back instead of failing. Both answer JSON only, a wrong method
included (no CSRF check: they change nothing and probes carry no cookies).
"""

import logging
from collections.abc import Callable
from functools import wraps

from django.db import connection
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt

from .celery import app as celery_app
from .error_responses import json_error_response
from .errors import MethodNotAllowed

logger = logging.getLogger(__name__)
READINESS_CHECKS = {}
# name -> () -> a line or None: what an operator must know about a ready replica (an
# emulated device), shown beside the checks
READINESS_NOTES: dict[str, Callable[[], str | None]] = {}


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


def probe(view):
    """GET only; any other method is a JSON 405."""

    @csrf_exempt
    @wraps(view)
    def answer(request):
        if request.method != "GET":
            return json_error_response(MethodNotAllowed("Use GET.", headers={"Allow": "GET"}))
        return view(request)

    return answer


@probe
def healthz(request):
    return JsonResponse({"status": "ok"})


@probe
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
    answer = {"status": "ok", "checks": sorted(READINESS_CHECKS)}
    notes = {name: line for name, note in READINESS_NOTES.items() if (line := note())}
    if notes:
        answer["notes"] = notes
    return JsonResponse(answer)
