"""Every exception becomes one ApiError, and every ApiError one answer: OpenAI's error shape.

`to_api_error` is the one mapping every transport shares: the DRF views answer through
`openai_exception_handler` (settings.REST_FRAMEWORK's EXCEPTION_HANDLER), the async /v1
views through `json_error_response`, and what no view answers (an unknown path, a failing
middleware) through Django's error handlers (platform_site/error_pages.py). Anything
unexpected is a bug, answered as a 500 whose message carries an id that is also logged with
the traceback, so a client's report leads to it; a caller's mistake is always an ApiError,
never a 500.
"""

import logging
import uuid

from django.core.exceptions import BadRequest, RequestDataTooBig, SuspiciousOperation
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404, JsonResponse
from rest_framework import exceptions as drf
from rest_framework.views import set_rollback

from inference import errors as inference_errors
from inference.engine import AdapterLoadError, EngineError, EngineStoppedError, PromptTooLongError
from tenants.keyauth import NO_CREDENTIALS, InvalidApiKey, MissingApiKey

from . import errors

logger = logging.getLogger(__name__)

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}

# The engine imports nothing from Django, so its refusals become API errors here:
# engine exception class -> (ApiError class, the request field to name). Most specific first.
ENGINE_ERRORS: dict[type, tuple[type[errors.ApiError], str | None]] = {
    PromptTooLongError: (inference_errors.ContextLengthExceeded, "messages"),
    AdapterLoadError: (inference_errors.AdapterUnavailable, None),
    EngineStoppedError: (inference_errors.EngineUnavailable, None),
    EngineError: (errors.ApiError, None),
}

# DRF's (and Django's) own exceptions -> the ApiError class that answers for them.
DRF_ERRORS = {
    drf.ValidationError: errors.ApiError,
    drf.ParseError: errors.UnparseableBody,
    drf.NotAuthenticated: MissingApiKey,
    drf.AuthenticationFailed: InvalidApiKey,
    drf.PermissionDenied: errors.InsufficientPermissions,
    drf.NotFound: errors.NotFound,
    drf.MethodNotAllowed: errors.MethodNotAllowed,
    drf.NotAcceptable: errors.NotAcceptable,
    drf.UnsupportedMediaType: errors.UnsupportedMediaType,
    DjangoValidationError: errors.ApiError,
    DjangoPermissionDenied: errors.InsufficientPermissions,
    Http404: errors.NotFound,
    RequestDataTooBig: errors.RequestTooLarge,  # a form field past DATA_UPLOAD_MAX_MEMORY_SIZE
    BadRequest: errors.ApiError,
    SuspiciousOperation: errors.ApiError,  # a bad Host header, too many form fields, ...
}
# Answered in our words: DRF's NotAuthenticated does not say what to send, and a 404's
# own text could tell another tenant's object from a missing one.
_OWN_WORDS = {
    drf.NotAuthenticated: NO_CREDENTIALS,
    Http404: "Not found.",
    DjangoPermissionDenied: "You do not have permission to perform this action.",
    RequestDataTooBig: "A form field is larger than this server accepts (LORAPLEX_MAX_REQUEST_BYTES).",
    # Its details (an unknown Host, the ALLOWED_HOSTS hint) are for the server's log.
    SuspiciousOperation: "The request was refused as malformed.",
}


def to_api_error(exc: BaseException) -> errors.ApiError:
    if isinstance(exc, errors.ApiError):
        return exc
    for cls in type(exc).__mro__:
        if cls in ENGINE_ERRORS:
            api_error, param = ENGINE_ERRORS[cls]
            return api_error(str(exc), param=param)
        if cls in DRF_ERRORS:
            return _from_framework(exc, DRF_ERRORS[cls])
    if isinstance(exc, drf.APIException) and exc.status_code < 500:
        # A DRF exception the table does not know (Throttled, say): still the caller's.
        error = _from_framework(exc, errors.ApiError)
        error.status = exc.status_code
        return error
    return _internal_error(exc)


def _from_framework(exc: BaseException, api_error: type[errors.ApiError]) -> errors.ApiError:
    words = next((w for cls, w in _OWN_WORDS.items() if isinstance(exc, cls)), None)
    if words is not None:
        return api_error(words)
    if isinstance(exc, DjangoValidationError):
        detail: object = exc.message_dict if hasattr(exc, "error_dict") else exc.messages
    elif isinstance(exc, drf.APIException):
        detail = exc.detail
    else:  # Django's BadRequest: its message is for the caller
        detail = str(exc) or errors.ApiError.message
    message, param = _first_problem(detail)
    return api_error(message, param=param)


def _first_problem(detail) -> tuple[str, str | None]:
    """Validation details are nested dicts and lists: (message, field) of the first problem."""
    if isinstance(detail, dict):
        for field, value in detail.items():
            message, inner = _first_problem(value)
            if field in ("non_field_errors", "__all__"):
                return message, inner
            return (message, inner) if inner else (f"{field}: {message}", field)
        return errors.ApiError.message, None
    if isinstance(detail, list | tuple) and detail:
        return _first_problem(detail[0])
    return str(detail), None


def _internal_error(exc: BaseException) -> errors.ApiError:
    error_id = uuid.uuid4().hex
    logger.error("internal error %s", error_id, exc_info=exc)
    return errors.InternalError(f"The server failed to answer (error id {error_id}).")


def error_body(error: errors.ApiError) -> dict:
    """OpenAI's `Error` object: `param` is always there (null when no one field is at fault)."""
    return {
        "error": {
            "message": error.message,
            "type": _TYPE_BY_STATUS.get(error.status, "api_error"),
            "param": error.param,
            "code": error.code,
        }
    }


def openai_exception_handler(exc, context) -> JsonResponse:
    """DRF's EXCEPTION_HANDLER: every exception a DRF view raises is answered here. A plain
    JsonResponse, not DRF's Response, so no renderer the request negotiated (the browsable
    API's HTML, the schema view's YAML) can render the error in another format."""
    set_rollback()
    return json_error_response(exc)


def json_error_response(exc: BaseException) -> JsonResponse:
    """The same answer for plain (async) Django views: the OpenAI-compatible API."""
    error = to_api_error(exc)
    return JsonResponse(error_body(error), status=error.status, headers=error.headers)
