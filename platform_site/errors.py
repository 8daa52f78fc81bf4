"""One error shape for every API path: OpenAI's `{"error": {"message", "type", "code"}}`.

OpenAI clients parse this shape, so control-plane and inference errors read the same.
"""

from django.http import Http404, JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


class ApiError(exceptions.APIException):
    """An error a caller can act on, with a stable machine-readable code."""

    def __init__(self, message: str, *, code: str, status_code: int = 400):
        super().__init__(detail=message, code=code)
        self.status_code = status_code


def error_body(message: str, *, code: str, status_code: int, param: str | None = None) -> dict:
    error = {
        "message": message,
        "type": _TYPE_BY_STATUS.get(status_code, "api_error"),
        "code": code,
    }
    if param is not None:
        error["param"] = param
    return {"error": error}


def error_response(message: str, *, code: str, status_code: int) -> JsonResponse:
    """For plain Django views (outside DRF) that must answer in the same shape."""
    return JsonResponse(error_body(message, code=code, status_code=status_code), status=status_code)


def _flatten(detail) -> tuple[str, str | None, str | None]:
    """DRF validation details are nested dicts/lists; name the first offending field."""
    if isinstance(detail, dict):
        for field, value in detail.items():
            message, code, inner = _flatten(value)
            name = field if field != "non_field_errors" else None
            param = inner or name
            if name and inner is None:
                message = f"{field}: {message}"
            return message, code, param
        return "Invalid request.", "invalid", None
    if isinstance(detail, list) and detail:
        return _flatten(detail[0])
    return str(detail), getattr(detail, "code", None), None


def openai_exception_handler(exc, context):
    if isinstance(exc, Http404):
        exc = exceptions.NotFound("Not found.")
    response = exception_handler(exc, context)
    if response is None:
        return None
    message, code, param = _flatten(exc.detail if hasattr(exc, "detail") else str(exc))
    if isinstance(exc, ApiError):
        code = exc.get_codes() if isinstance(exc.get_codes(), str) else code
    code = code or "error"
    if isinstance(exc, exceptions.NotAuthenticated):
        code = "missing_api_key"
        message = "No credentials: send 'Authorization: Bearer <api key>'."
    if response.status_code == status.HTTP_403_FORBIDDEN and code == "permission_denied":
        code = "insufficient_permissions"
    body = error_body(message, code=code, status_code=response.status_code, param=param)
    return Response(body, status=response.status_code, headers=_passthrough_headers(response))


def _passthrough_headers(response) -> dict:
    return {k: v for k, v in response.items() if k in ("WWW-Authenticate", "Retry-After", "Allow")}
