"""Who calls the serving layer: a Bearer key with the `inference` scope, or a signed-in member
(the web playground) whose request carries the CSRF token; Prometheus with the metrics token.

The OpenAI and operator endpoints are CSRF-exempt because API clients send no cookies; a
session caller therefore gets the CSRF check here, exactly as DRF does for its session auth.
"""

import hmac

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.utils import timezone

from platform_site.errors import CsrfFailed
from tenants.keyauth import (
    InsufficientScope,
    KeyRejected,
    api_key_from_header,
    bearer_token,
    cached_api_key,
    require_usable,
)
from tenants.principal import SESSION_TENANT, TENANT_HEADER, Principal, principal_for
from tenants.scopes import INFERENCE
from tenants.services import api_key_touch, api_key_touch_due

from .errors import MetricsTokenRequired


class _CsrfCheck(CsrfViewMiddleware):
    def _reject(self, request, reason):
        return reason


def _no_view(request: HttpRequest) -> HttpResponse:
    """Stands in for the middleware's get_response and the view: process_view calls neither."""
    raise NotImplementedError


def require_csrf(request) -> None:
    """A session caller's unsafe request must carry the page's CSRF token (safe methods pass)."""
    reason = _CsrfCheck(_no_view).process_view(request, _no_view, (), {})
    if reason:
        raise CsrfFailed(f"CSRF check failed: {reason}.")


def inference_principal(request, *, scope: str = INFERENCE) -> Principal:
    """Runs in a thread (it reads the database). Raises a KeyRejected saying why not."""
    header = request.META.get("HTTP_AUTHORIZATION")
    user = getattr(request, "user", None)
    if not header and user is not None and user.is_authenticated:
        require_csrf(request)
        slug = request.META.get(TENANT_HEADER) or request.session.get(SESSION_TENANT)
        principal = principal_for(user=user, tenant_slug=slug)
    else:
        api_key = api_key_from_header(header)
        api_key_touch(api_key=api_key)
        principal = principal_for(api_key=api_key)
    return _with_scope(principal, scope)


async def inference_principal_async(request, *, scope: str = INFERENCE) -> Principal:
    """inference_principal, on the event loop when the caller's key was verified in this
    process within the last second and its last use needs no write; else in a thread."""
    header = request.META.get("HTTP_AUTHORIZATION")
    if header:
        try:
            api_key = cached_api_key(bearer_token(header))
        except KeyRejected:
            api_key = None  # inference_principal says why
        if api_key is not None and not api_key_touch_due(api_key, timezone.now()):
            require_usable(api_key)
            return _with_scope(principal_for(api_key=api_key), scope)
    return await sync_to_async(inference_principal)(request, scope=scope)


def _with_scope(principal: Principal, scope: str) -> Principal:
    if not principal.has_scope(scope):
        raise InsufficientScope(principal.missing_scope_message(scope))
    return principal


def authorize_scrape(request) -> None:
    """With LORAPLEX_METRICS_TOKEN set, /metrics answers only `Authorization: Bearer <it>`."""
    token = settings.METRICS_TOKEN
    if not token:
        return  # the embedded default: open, and without adapter names (inference/metrics.py)
    scheme, _, given = (request.META.get("HTTP_AUTHORIZATION") or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        given.strip().encode(), token.encode()
    ):
        raise MetricsTokenRequired(
            "/metrics needs 'Authorization: Bearer <LORAPLEX_METRICS_TOKEN>' "
            "(Prometheus: `authorization` in the scrape config)."
        )
