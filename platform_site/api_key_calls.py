"""An API-key call to the OpenAI-compatible API, answered on the event loop from the socket
to the view: no session, CSRF, messages or static files, which such a call never uses, and
none of the sync middleware that would each hop to a thread and back for every request.

A call to /v1/ that carries an `Authorization` header is a program's: it authenticates by
its key alone (inference/auth.py takes the key path whenever the header is there). Anything
else, the web playground's session calls included, goes through the whole middleware chain.
What the chain does for every response still holds here: the host is checked against
ALLOWED_HOSTS, and SecurityMiddleware's redirect and headers and X-Frame-Options apply.
"""

from asgiref.sync import markcoroutinefunction
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.exception import convert_exception_to_response
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.security import SecurityMiddleware

API_KEY_PREFIX = "/v1/"


def is_api_key_call(scope) -> bool:
    return (
        scope["type"] == "http"
        and scope["path"].startswith(API_KEY_PREFIX)
        and any(name == b"authorization" for name, _ in scope["headers"])
    )


class ApiKeyCallMiddleware:
    """SecurityMiddleware and XFrameOptionsMiddleware's work, called inline (both only
    compute headers and a redirect), and the ALLOWED_HOSTS check the chain's CSRF and
    common middleware would make."""

    async_capable = True
    sync_capable = False

    def __init__(self, get_response):
        self.get_response = get_response
        markcoroutinefunction(self)  # so Django's wrappers await it
        self.security = SecurityMiddleware(get_response)
        self.frame_options = XFrameOptionsMiddleware(get_response)

    async def __call__(self, request):
        response = self.security.process_request(request)
        if response is None:
            request.get_host()  # DisallowedHost: a 400, as on every other path
            response = await self.get_response(request)
        response = self.security.process_response(request, response)
        return self.frame_options.process_response(request, response)


class ApiKeyCallHandler(ASGIHandler):
    """Django's ASGI handler with ApiKeyCallMiddleware as its whole chain."""

    def load_middleware(self, is_async: bool = False) -> None:
        assert is_async, "API-key calls are served over ASGI only"
        self._view_middleware: list = []
        self._template_response_middleware: list = []
        self._exception_middleware: list = []
        view = convert_exception_to_response(self._get_response_async)  # type: ignore[attr-defined]
        self._middleware_chain = convert_exception_to_response(ApiKeyCallMiddleware(view))
