"""Request bodies are bounded in front of Django: it never reads a byte past the limit.

Django's ASGI handler reads the whole body (spilling it to a temporary file) before any
middleware or view runs, and uvicorn sets no limit, so a limit checked in a view acts only
once the bytes are on disk. This ASGI middleware wraps Django instead: a declared
Content-Length over the route's limit is refused at once, unread; a chunked body is
counted as it arrives and cut at the limit; a body that stops arriving for
LORAPLEX_BODY_TIMEOUT_SECONDS is cut too. Each refusal is a JSON answer in OpenAI's
shape that closes the connection, so the rest of the body is never read.

Every request takes LORAPLEX_MAX_REQUEST_BYTES, except the multipart routes an app
registers a limit of its own for (`register_route_limits`: the registry's uploads). On those,
each part is followed as it arrives (multipart_parts.py): a file part over its own limit, or
the form fields over Django's, is refused the moment it passes, naming the part, however
much of the body is still to come.
"""

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.urls import Resolver404, resolve

from platform_site.error_responses import error_body, to_api_error
from platform_site.errors import ApiError, RequestTimeout, RequestTooLarge
from platform_site.multipart_parts import PartOverLimit, PartScanner, boundary_of

log = logging.getLogger(__name__)

# (the declared size or None while counting, the limit) -> the refusal to answer
Refusal = Callable[[int | None, int], ApiError]


@dataclass(frozen=True)
class RouteLimit:
    """A multipart body's own limits on one route (its URL name), for one method: the whole
    body's and, optionally, each file part's by its field name."""

    method: str
    limit: Callable[[], int]  # bytes, read from the settings when a request arrives
    refuse: Refusal
    parts: Callable[[], dict[str, int]] | None = None  # field name -> bytes
    refuse_part: Callable[[str, int], ApiError] | None = None  # (field name, its limit)


ROUTE_LIMITS: dict[str, RouteLimit] = {}


def register_route_limits(table: dict[str, RouteLimit]) -> None:
    """Called from an app's AppConfig.ready()."""
    ROUTE_LIMITS.update(table)


class BodyRefused(Exception):
    """Raised out of `receive` to stop Django reading; carries the answer to send."""

    def __init__(self, error: ApiError):
        super().__init__(error.message)
        self.error = error


class BodyLimits:
    """ASGI middleware around Django (platform_site/asgi.py)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        own = _own_limit(scope)
        limit, too_large = _whole_body(own)
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            return await _answer(send, too_large(declared, limit))
        counted = _Counted(receive, limit, too_large, _part_limits(scope, own))
        try:
            await self.app(scope, counted, send)
        except BodyRefused as refusal:  # Django answers only once it has the whole body:
            await _answer(send, refusal.error)  # nothing has been sent yet


def route_limit(scope) -> tuple[int, Refusal]:
    """(bytes, how to refuse more) for this request."""
    return _whole_body(_own_limit(scope))


def _whole_body(own: RouteLimit | None) -> tuple[int, Refusal]:
    if own is not None:
        return own.limit(), own.refuse
    return settings.MAX_REQUEST_BYTES, _request_too_large


def _own_limit(scope) -> RouteLimit | None:
    if not _is_multipart(scope):
        return None
    own = ROUTE_LIMITS.get(_route(scope) or "")
    return own if own is not None and own.method == scope["method"] else None


class _Parts:
    """A route's part limits applied to one body: its scanner, and how to refuse a part."""

    def __init__(self, scanner: PartScanner, refuse_part: Callable[[str, int], ApiError]):
        self.scanner: PartScanner | None = scanner
        self.refuse_part = refuse_part

    def feed(self, body: bytes, *, end: bool = False) -> None:
        if self.scanner is None:
            return
        try:
            self.scanner.feed(body)
            if end:
                self.scanner.finish()
        except PartOverLimit as over:
            part = over.part
            if part.is_file:
                raise BodyRefused(self.refuse_part(part.name, over.limit)) from None
            raise BodyRefused(_naming(to_api_error(RequestDataTooBig()), part.name)) from None
        except Exception:  # a scanner bug must not cost the upload: Django's parser decides
            log.exception("the multipart scanner failed; this body's parts go uncounted")
            self.scanner = None

    def current(self) -> str | None:
        """The part being received, which a whole-body refusal names."""
        part = self.scanner.part if self.scanner is not None else None
        return part.name if part is not None else None


def _part_limits(scope, own: RouteLimit | None) -> _Parts | None:
    """The part limits of this request's route, or None: none registered, or a body whose
    boundary Django refuses itself (a 400 before it reads a part)."""
    if own is None or own.parts is None or own.refuse_part is None:
        return None
    # Django's CONTENT_TYPE: every Content-Type header, joined with commas
    content_type = ",".join(
        v.decode("latin1") for k, v in scope["headers"] if k.lower() == b"content-type"
    )
    boundary = boundary_of(content_type)
    if boundary is None:
        return None
    scanner = PartScanner(boundary, own.parts(), settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
    return _Parts(scanner, own.refuse_part)


def _naming(error: ApiError, part: str | None) -> ApiError:
    """The error, naming `part` unless it names a field already."""
    if error.param is None and part is not None:
        error.param = part
    return error


def _request_too_large(size: int | None, limit: int) -> ApiError:
    return RequestTooLarge(
        f"The request body {described_size(size, limit)}; this server accepts at most {limit} "
        "bytes (LORAPLEX_MAX_REQUEST_BYTES)."
    )


def described_size(size: int | None, limit: int) -> str:
    """`is 5000 bytes` when declared, `passed 4096 bytes` when counted."""
    return f"is {size} bytes" if size is not None else f"passed {limit} bytes"


class _Counted:
    """Django's `receive`, counting body bytes (and each part's, where the route has part
    limits) and timing each wait for more."""

    def __init__(self, receive, limit: int, too_large: Refusal, parts: _Parts | None = None):
        self.receive, self.limit, self.too_large = receive, limit, too_large
        self.parts = parts
        self.received = 0
        self.complete = False

    async def __call__(self):
        if self.complete:  # afterwards Django only waits for the disconnect: no deadline
            return await self.receive()
        timeout = settings.BODY_TIMEOUT_SECONDS
        try:
            async with asyncio.timeout(timeout):
                message = await self.receive()
        except TimeoutError:
            raise BodyRefused(
                RequestTimeout(
                    f"The request body stopped arriving for {timeout:g} seconds; "
                    f"send it without pauses."
                )
            ) from None
        if message["type"] == "http.request":
            body = message.get("body", b"")
            self.received += len(body)
            self.complete = not message.get("more_body", False)
            if self.parts is not None:
                self.parts.feed(body, end=self.complete)
            if self.received > self.limit:
                part = self.parts.current() if self.parts is not None else None
                raise BodyRefused(_naming(self.too_large(None, self.limit), part))
        return message


def _route(scope) -> str | None:
    path = scope["path"]
    root = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    try:
        return resolve(path).url_name
    except Resolver404:
        return None


def _header(scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key.lower() == name:
            return value
    return None


def _is_multipart(scope) -> bool:
    return (_header(scope, b"content-type") or b"").lower().startswith(b"multipart/form-data")


def _content_length(scope) -> int | None:
    value = _header(scope, b"content-length")
    # uvicorn (h11) refuses a malformed Content-Length before the app sees the request
    return int(value) if value is not None and value.isdigit() else None


async def _answer(send, error: ApiError) -> None:
    body = json.dumps(error_body(error)).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),  # the unread rest of the body must not be parsed as a request
        *((k.lower().encode(), str(v).encode()) for k, v in error.headers.items()),
    ]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
