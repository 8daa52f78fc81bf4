"""Django's own error answers (handler400/403/404/500, the CSRF failure view): JSON in OpenAI's
error shape on the API paths, the web's HTML pages everywhere else.

A view under /v1/ or /api/ answers its own errors (the serving layer's json_endpoint, DRF's
exception handler); these answer what happens outside any view: no route matches, a
middleware refuses the request (a bad Host header, a CSRF failure) or fails. Registered in
platform_site/urls.py and settings.CSRF_FAILURE_VIEW. With DEBUG on, Django shows its debug
pages instead (never in production: platform_site/checks.py).
"""

import sys

from django.urls import Resolver404, is_valid_path
from django.views import csrf, defaults

from .api_paths import is_api_path
from .error_responses import json_error_response
from .errors import CsrfFailed, InternalError, UnknownPath

_SHOWN_PATH_CHARS = 200  # an unknown path is echoed back, but not a megabyte of it


def bad_request(request, exception):
    if is_api_path(request.path_info):
        return json_error_response(exception)
    return defaults.bad_request(request, exception)


def permission_denied(request, exception):
    if is_api_path(request.path_info):
        return json_error_response(exception)
    return defaults.permission_denied(request, exception)


def page_not_found(request, exception):
    if not is_api_path(request.path_info):
        return defaults.page_not_found(request, exception)
    if isinstance(exception, Resolver404):
        exception = UnknownPath(_unknown_path_message(request))
    return json_error_response(exception)


def _unknown_path_message(request) -> str:
    """Names the path, and its twin with or without the trailing slash where that one exists."""
    path = request.path
    if len(path) > _SHOWN_PATH_CHARS:
        return f"No endpoint answers {request.method} {path[:_SHOWN_PATH_CHARS]}..."
    message = f"No endpoint answers {request.method} {path}; "
    twin = _slash_twin(request.path_info)
    if twin != "/" and is_valid_path(twin):
        return message + f"did you mean {_slash_twin(path)} ?"
    return message + "/api/docs/ lists this server's API."


def _slash_twin(path: str) -> str:
    return path[:-1] if path.endswith("/") else path + "/"


def server_error(request):
    """Django calls this while it handles the exception (under ASGI too: asgiref re-raises it
    in the worker thread), so the answer's error id is logged with its traceback."""
    if is_api_path(request.path_info):
        return json_error_response(sys.exception() or InternalError())
    return defaults.server_error(request)


def csrf_failure(request, reason=""):
    if is_api_path(request.path_info):
        return json_error_response(CsrfFailed(f"CSRF check failed: {reason}."))
    return csrf.csrf_failure(request, reason)
