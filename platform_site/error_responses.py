"""Every exception becomes one ApiError, and every ApiError one answer: OpenAI's error shape.

`to_api_error` is the one mapping every transport shares (each app registers how its own
exceptions answer: error_translations.py): the DRF views answer through
`openai_exception_handler` (settings.REST_FRAMEWORK's EXCEPTION_HANDLER), the async /v1
views through `json_error_response`, and what no view answers (an unknown path, a failing
middleware) through Django's error handlers (platform_site/error_pages.py). Anything
unexpected is a bug, answered as a 500 whose message carries an id that is also logged with
the traceback, so a client's report leads to it; a caller's mistake is always an ApiError,
never a 500.
"""

import logging
import traceback
import uuid

from django.core.exceptions import BadRequest, RequestDataTooBig, SuspiciousOperation
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404, JsonResponse
from rest_framework import exceptions as drf
from rest_framework.views import set_rollback

from . import errors
from .error_translations import REGISTERED, Translation

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


# The frameworks' exceptions; each app registers its own when Django starts it
# (error_translations.py: the serving layer the engine's, tenants the authentication
# failures), looked up first.
FRAMEWORK_TRANSLATIONS: dict[type[BaseException], Translation] = {
    drf.ValidationError: Translation(errors.ApiError),
    drf.ParseError: Translation(errors.UnparseableBody),
    drf.PermissionDenied: Translation(errors.InsufficientPermissions),
    drf.NotFound: Translation(errors.NotFound),
    drf.MethodNotAllowed: Translation(errors.MethodNotAllowed),
    drf.NotAcceptable: Translation(errors.NotAcceptable),
    drf.UnsupportedMediaType: Translation(errors.UnsupportedMediaType),
    DjangoValidationError: Translation(errors.ApiError),
    # A 404's own text could tell another tenant's object from a missing one.
    DjangoPermissionDenied: Translation(
        errors.InsufficientPermissions, words="You do not have permission to perform this action."
    ),
    Http404: Translation(errors.NotFound, words="Not found."),
    RequestDataTooBig: Translation(  # a form field past DATA_UPLOAD_MAX_MEMORY_SIZE
        errors.RequestTooLarge,
        words="A form field is larger than this server accepts (LORAPLEX_MAX_REQUEST_BYTES).",
    ),
    BadRequest: Translation(errors.ApiError),
    # Its details (an unknown Host, the ALLOWED_HOSTS hint) are for the server's log.
    SuspiciousOperation: Translation(
        errors.ApiError, words="The request was refused as malformed."
    ),
}


def to_api_error(exc: BaseException) -> errors.ApiError:
    if isinstance(exc, errors.ApiError):
        return exc
    for cls in type(exc).__mro__:
        translation = REGISTERED.get(cls) or FRAMEWORK_TRANSLATIONS.get(cls)
        if translation is not None:
            return _translate(exc, translation)
    if isinstance(exc, drf.APIException) and exc.status_code < 500:
        # A DRF exception the table does not know (Throttled, say): still the caller's.
        error = _translate(exc, Translation(errors.ApiError))
        error.status = exc.status_code
        return error
    return _internal_error(exc)


def _translate(exc: BaseException, translation: Translation) -> errors.ApiError:
    if translation.words is not None:
        return translation.api_error(translation.words, param=translation.param)
    if isinstance(exc, DjangoValidationError):
        detail: object = exc.message_dict if hasattr(exc, "error_dict") else exc.messages
    elif isinstance(exc, drf.APIException):
        detail = exc.detail
    else:  # Django's BadRequest, an app's own exception: its message is for the caller
        detail = str(exc) or errors.ApiError.message
    message, path = _first_problem(detail)
    param = param_path(path)
    if param is not None:
        message = f"{param}: {message}"
    named = getattr(exc, "param", None)
    return translation.api_error(message, param=named or param or translation.param)


# Keys that hold errors of the whole object around them, not of one field.
_WHOLE_OBJECT_KEYS = ("non_field_errors", "__all__")


def _first_problem(detail) -> tuple[str, list[str | int]]:
    """Validation details are nested dicts and lists: the first problem's message and the
    keys and list positions that lead to it (a ListField's or DictField's items are keyed by
    their index or key; a list serializer's items are a list of dicts, empty where valid)."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            if not value:
                continue
            message, inner = _first_problem(value)
            return message, inner if key in _WHOLE_OBJECT_KEYS else [key, *inner]
        return errors.ApiError.message, []
    if isinstance(detail, list | tuple):
        for index, item in enumerate(detail):
            if isinstance(item, dict | list | tuple):
                if item:  # one item's errors: its position is part of the path
                    message, inner = _first_problem(item)
                    return message, [index, *inner]
            else:  # the messages of the field the caller is in
                return str(item), []
        return errors.ApiError.message, []
    return str(detail), []


def param_path(path: list[str | int]) -> str | None:
    """`["scopes", 1]` -> `scopes[1]`, `["a", "b"]` -> `a.b`: a string, as OpenAI's `param`
    is, never a bare index."""
    text = ""
    for step in path:
        if isinstance(step, int):
            text += f"[{step}]"
        else:
            text += f".{step}" if text else str(step)
    return text or None


def _internal_error(exc: BaseException) -> errors.ApiError:
    error_id = uuid.uuid4().hex
    logger.error("internal error %s\n%s", error_id, bounded_traceback(exc))
    return errors.InternalError(f"The server failed to answer (error id {error_id}).")


LOGGED_LINE_CHARS = 500  # an exception's message can quote a request body or a grammar whole
LOGGED_TRACEBACK_CHARS = 8000


def bounded_traceback(exc: BaseException) -> str:
    """The traceback, each line and the whole cut short: a few KB per failure, whatever the
    exception quotes."""
    lines = traceback.format_exception(exc)
    text = "".join(
        line if len(line) <= LOGGED_LINE_CHARS else line[:LOGGED_LINE_CHARS] + "...[cut]\n"
        for line in lines
    )
    if len(text) <= LOGGED_TRACEBACK_CHARS:
        return text.rstrip()
    half = LOGGED_TRACEBACK_CHARS // 2
    return f"{text[:half]}\n...[{len(text) - 2 * half} characters cut]...\n{text[-half:]}".rstrip()


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
