"""API-key calls to /v1/ through the served ASGI application (platform_site.asgi): they skip
the browser's middleware (no session, no CSRF, no thread hop per middleware) yet keep what
the chain does for every response; a key verified in the last second costs no query, and a
revocation still takes effect."""

import httpx
import pytest
from asgiref.sync import async_to_sync
from django.core import signals
from django.db import close_old_connections
from django.utils import timezone

from platform_site.api_key_calls import is_api_key_call
from platform_site.asgi import application
from tenants.key_cache import KEYS, ApiKeyCache
from tenants.models import ApiKey
from tenants.services import api_key_revoke

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh_key_cache():
    KEYS.clear()
    yield
    KEYS.clear()


def call(path: str, headers: dict[str, str], host: str = "localhost") -> httpx.Response:
    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url=f"http://{host}") as client:
            return await client.get(path, headers=headers)

    # as Django's test client does: the request keeps the test's database connection
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        return async_to_sync(run)()
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


def bearer(full: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {full}"}


def test_a_key_call_skips_the_browsers_middleware_and_keeps_its_headers(tenant_a, make_key):
    _, full = make_key(tenant_a)
    response = call("/v1/models", bearer(full))
    assert response.status_code == 200 and response.json()["object"] == "list"
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["x-frame-options"] == "DENY"
    assert "cookie" not in response.headers.get("vary", "").lower()  # no session looked at
    browser = call("/v1/models", {})  # no key: the whole chain, and its 401
    assert browser.status_code == 401 and "x-frame-options" in browser.headers


def test_a_key_call_to_a_host_not_allowed_is_a_400(tenant_a, make_key):
    _, full = make_key(tenant_a)
    assert call("/v1/models", bearer(full), host="evil.example").status_code == 400


def test_only_v1_calls_with_a_key_take_the_lean_path():
    def scope(path: str, headers: list) -> dict:
        return {"type": "http", "path": path, "headers": headers}

    key = [(b"authorization", b"Bearer x")]
    assert is_api_key_call(scope("/v1/chat/completions", key))
    assert not is_api_key_call(scope("/v1/chat/completions", [(b"cookie", b"sessionid=1")]))
    assert not is_api_key_call(scope("/api/v1/adapters/", key))
    assert not is_api_key_call({"type": "websocket", "path": "/v1/x", "headers": key})


def test_a_key_used_again_within_a_second_costs_no_query(
    tenant_a, make_key, django_assert_num_queries
):
    _, full = make_key(tenant_a)
    assert call("/v1/models", bearer(full)).status_code == 200  # read, and its use recorded
    from inference.auth import inference_principal_async

    class Request:
        META = {"HTTP_AUTHORIZATION": f"Bearer {full}"}

    with django_assert_num_queries(0):
        principal = async_to_sync(inference_principal_async)(Request())
    assert principal.tenant.slug == "tenant-a"


def test_a_revocation_here_takes_effect_at_once(tenant_a, make_key):
    api_key, full = make_key(tenant_a)
    assert call("/v1/models", bearer(full)).status_code == 200
    api_key_revoke(api_key=api_key)
    response = call("/v1/models", bearer(full))
    assert response.status_code == 401 and response.json()["error"]["code"] == "revoked_api_key"


def test_a_revocation_elsewhere_takes_effect_within_a_second(tenant_a, make_key, monkeypatch):
    now = [0.0]
    monkeypatch.setattr(KEYS, "clock", lambda: now[0])
    api_key, full = make_key(tenant_a)
    assert call("/v1/models", bearer(full)).status_code == 200
    # another process revokes it: this one hears nothing, its cached key says "live"
    ApiKey.objects.filter(pk=api_key.pk).update(revoked_at=timezone.now())
    now[0] = 0.5
    assert call("/v1/models", bearer(full)).status_code == 200
    now[0] = 1.0
    assert call("/v1/models", bearer(full)).status_code == 401


def test_the_cache_forgets_keys_after_their_second_and_stays_bounded(monkeypatch):
    import tenants.key_cache as key_cache

    now = [0.0]
    cache = ApiKeyCache(seconds=1.0, clock=lambda: now[0])
    key = ApiKey(prefix="p", hashed_key="h")
    cache.put("h", key)
    assert cache.get("h") is key and cache.get("other") is None
    now[0] = 1.0
    assert cache.get("h") is None
    monkeypatch.setattr(key_cache, "MAX_CACHED_KEYS", 3)
    for i in range(10):
        cache.put(f"k{i}", key)
    assert len(cache._keys) <= 3 and cache.get("k9") is key
