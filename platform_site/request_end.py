"""The end of an HTTP request, for work that must happen however the request ends.

When a client disconnects, Django cancels the tasks answering it and waits for them; a
streaming response whose body had not started is dropped, and that body never runs, its
`finally` included. Only the ASGI call's return is reached on every path, after every task
of the request has ended: `on_request_end(fn)` runs `fn` then (at once if the request has
already ended). Outside an ASGI request (the test clients) it does nothing, and the
caller's own `finally` is all there is.
"""

import logging
from collections.abc import Callable
from contextvars import ContextVar

logger = logging.getLogger(__name__)


class _RequestEnd:
    def __init__(self) -> None:
        self.ended = False
        self.callbacks: list[Callable[[], None]] = []

    def run(self) -> None:
        self.ended = True
        callbacks, self.callbacks = self.callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:  # one failing must not keep the others from running
                logger.exception("a request-end callback failed")


# Set per request by RequestEnd; every task and thread serving the request copies the
# context, and so shares this one object.
_current: ContextVar[_RequestEnd | None] = ContextVar("loraplex_request_end", default=None)


def on_request_end(callback: Callable[[], None]) -> None:
    end = _current.get()
    if end is None:
        return
    if end.ended:
        callback()
    else:
        end.callbacks.append(callback)


class RequestEnd:
    """ASGI middleware: runs the request's `on_request_end` callbacks once the app returns."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        end = _RequestEnd()
        token = _current.set(end)
        try:
            await self.app(scope, receive, send)
        finally:
            _current.reset(token)
            end.run()
