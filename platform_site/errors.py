"""The one error model: an `ApiError` is a refusal a caller can act on, whatever the transport.

Each subclass is one stable `code` with its HTTP `status`; domain errors subclass it where
their domain lives (registry/errors.py, tenants/keyauth.py, inference/errors.py), and
platform_site/error_responses.py turns any of them into OpenAI's error shape. Plain Python:
the engine-facing and parsing code may raise these without importing Django.
docs/errors.md lists every code; tests/platform/test_error_codes.py keeps the two in step.
"""


class ApiError(Exception):
    """A request the caller must change (400). `message` says how; `param` names the field."""

    status: int = 400
    code: str = "invalid_request"
    message: str = "The request is invalid."
    param: str | None = None

    def __init_subclass__(cls, *, status: int | None = None, code: str | None = None, **kwargs):
        """`class AdapterExists(Conflict, code="adapter_exists")`: the class line says it all."""
        super().__init_subclass__(**kwargs)
        if status is not None:
            cls.status = status
        if code is not None:
            cls.code = code

    def __init__(
        self,
        message: str | None = None,
        *,
        param: str | None = None,
        headers: dict | None = None,
        code: str | None = None,
    ):
        if message is not None:
            self.message = message
        if param is not None:
            self.param = param
        if code is not None:  # only for a class that really carries several codes
            self.code = code
        self.headers = dict(headers or {})
        super().__init__(self.message)


class NotFound(ApiError, status=404, code="not_found"):
    """No such object, or not the caller's: the same answer either way."""


class UnknownPath(NotFound, status=404, code="unknown_path"):
    """No endpoint at this path (under /v1/ or /api/): a typo, or an API this server lacks."""


class MethodNotAllowed(ApiError, status=405, code="method_not_allowed"):
    """The path exists but not with this HTTP method; `Allow` lists those it takes."""


class InsufficientPermissions(ApiError, status=403, code="insufficient_permissions"):
    """Signed in, but not allowed to do this (also a session's failed CSRF check on the REST
    API)."""


class CsrfFailed(ApiError, status=403, code="csrf_failed"):
    """A signed-in browser's request without the page's CSRF token."""


class UnparseableBody(ApiError, status=400, code="parse_error"):
    """The REST API could not parse the body as the content type it claims (JSON, multipart)."""


class NotAcceptable(ApiError, status=406, code="not_acceptable"):
    """The `Accept` header asks for a format the endpoint cannot answer in."""


class UnsupportedMediaType(ApiError, status=415, code="unsupported_media_type"):
    """The body's `Content-Type` is not one the endpoint reads."""


class RequestTooLarge(ApiError, status=413, code="request_too_large"):
    """The body is larger than LORAPLEX_MAX_REQUEST_BYTES (refused before it is read)."""


class RequestTimeout(ApiError, status=408, code="request_timeout"):
    """The body stopped arriving for LORAPLEX_BODY_TIMEOUT_SECONDS."""


class InternalError(ApiError, status=500, code="internal_error"):
    """A bug or a broken dependency, never the caller's fault; the message carries the id logged."""
