"""Request bodies are bounded in front of Django: it never reads a byte past the limit.

Django's ASGI handler reads the whole body (spilling it to a temporary file) before any
middleware or view runs, and uvicorn sets no limit, so a limit checked in a view acts only
once the bytes are on disk. This ASGI middleware wraps Django instead: a declared
Content-Length over the route's limit is refused at once, unread; a chunked body is
counted as it arrives and cut at the limit; a body that stops arriving for
LORAPLEX_BODY_TIMEOUT_SECONDS is cut too. Each refusal is a JSON answer in OpenAI's
shape that closes the connection, so the rest of the body is never read.

The adapter upload (multipart POST to the versions endpoint) may carry the adapter limit
plus its config; every other request takes LORAPLEX_MAX_REQUEST_BYTES.
"""

import asyncio
import json
from collections.abc import Callable

from django.conf import settings
from django.urls import Resolver404, resolve

from platform_site.error_responses import error_body
from platform_site.errors import ApiError, RequestTimeout, RequestTooLarge
from registry.errors import UploadTooLarge
from registry.uploads import MULTIPART_OVERHEAD, limits

UPLOAD_ROUTE = "registry-versions"
EVAL_SET_ROUTE = "registry-eval-set"
# (the declared size or None while counting, the limit) -> the refusal to answer
Refusal = Callable[[int | None, int], ApiError]


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
        limit, too_large = route_limit(scope)
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            return await _answer(send, too_large(declared, limit))
        try:
            await self.app(scope, _Counted(receive, limit, too_large), send)
        except BodyRefused as refusal:  # Django answers only once it has the whole body:
            await _answer(send, refusal.error)  # nothing has been sent yet


def route_limit(scope) -> tuple[int, Refusal]:
    """(bytes, how to refuse more) for this request."""
    if scope["method"] == "POST" and _is_multipart(scope) and _route(scope) == UPLOAD_ROUTE:
        return sum(limits().values()) + MULTIPART_OVERHEAD, _upload_too_large
    if scope["method"] == "PUT" and _is_multipart(scope) and _route(scope) == EVAL_SET_ROUTE:
        return settings.EVAL_MAX_BYTES + MULTIPART_OVERHEAD, _eval_set_too_large
    return settings.MAX_REQUEST_BYTES, _request_too_large


def _request_too_large(size: int | None, limit: int) -> ApiError:
    return RequestTooLarge(
        f"The request body {_size(size, limit)}; this server accepts at most {limit} bytes "
        f"(LORAPLEX_MAX_REQUEST_BYTES)."
    )


def _upload_too_large(size: int | None, limit: int) -> ApiError:
    return UploadTooLarge(
        f"The upload {_size(size, limit)}; this deployment accepts adapters up to "
        f"{settings.MAX_ADAPTER_BYTES} bytes of weights ({limit} bytes with the config and "
        f"an eval set of up to {settings.EVAL_MAX_BYTES} bytes)."
    )


def _eval_set_too_large(size: int | None, limit: int) -> ApiError:
    return UploadTooLarge(
        f"The upload {_size(size, limit)}; eval sets may hold up to {settings.EVAL_MAX_BYTES} "
        f"bytes (LORAPLEX_EVAL_MAX_BYTES)."
    )


def _size(size: int | None, limit: int) -> str:
    return f"is {size} bytes" if size is not None else f"passed {limit} bytes"


class _Counted:
    """Django's `receive`, counting body bytes and timing each wait for more."""

    def __init__(self, receive, limit: int, too_large: Refusal):
        self.receive, self.limit, self.too_large = receive, limit, too_large
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
            self.received += len(message.get("body", b""))
            if self.received > self.limit:
                raise BodyRefused(self.too_large(None, self.limit))
            self.complete = not message.get("more_body", False)
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
