"""The limits' bookkeeping, in this process's cache: reservations, settling, callers, a dead Redis.

The same rules through a live server and real concurrent requests: test_ratelimit_live.py.
"""

import logging
import socket

import pytest
from django.core.cache import cache

from inference import ratelimit
from inference.errors import RateLimited, TokensExceeded
from inference.metrics import RATELIMIT_BACKEND_ERRORS
from tenants.models import ApiKey, Tenant
from tenants.principal import Principal


@pytest.fixture(autouse=True)
def local_cache(settings):
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    settings.RATE_LIMIT_REQUESTS_PER_MINUTE = 3
    settings.RATE_LIMIT_TOKENS_PER_MINUTE = 300
    cache.clear()
    ratelimit._warned_at = None


def settled() -> None:
    """Wait for the background settler (one thread: anything submitted before is done)."""
    ratelimit._settler.submit(lambda: None).result(timeout=5)


def used(tenant_id: int) -> int:
    start, _ = ratelimit._window()
    return cache.get(f"rl:tok:{tenant_id}:{start}", 0)


def key_principal(tenant_id: int, prefix: str) -> Principal:
    return Principal(
        tenant=Tenant(id=tenant_id, slug=f"t{tenant_id}"),
        scopes=frozenset(),
        api_key=ApiKey(prefix=prefix),
    )


def user_principal(tenant_id: int, user_id: int) -> Principal:
    from django.contrib.auth import get_user_model

    return Principal(
        tenant=Tenant(id=tenant_id, slug=f"t{tenant_id}"),
        scopes=frozenset(),
        user=get_user_model()(pk=user_id),
        role="member",
    )


def test_reservations_never_pass_the_budget_and_a_refused_one_is_taken_back():
    for _ in range(2):
        ratelimit.reserve_tokens(tenant_id=1, tokens=130)
    with pytest.raises(TokensExceeded) as refused:
        ratelimit.reserve_tokens(tenant_id=1, tokens=130)
    assert "40 of this tenant's 300 tokens per minute are left" in refused.value.message
    assert int(refused.value.headers["Retry-After"]) >= 1
    assert used(1) == 260
    ratelimit.reserve_tokens(tenant_id=1, tokens=40)  # what is left still fits
    assert used(1) == 300
    ratelimit.reserve_tokens(tenant_id=2, tokens=300)  # another tenant's budget


def test_settling_gives_back_what_the_request_did_not_use():
    reservation = ratelimit.reserve_tokens(tenant_id=1, tokens=250)
    ratelimit.settle_tokens(reservation, used=60)
    settled()
    assert used(1) == 60
    ratelimit.reserve_tokens(tenant_id=1, tokens=240)  # fits only because 190 came back


def test_a_request_refused_before_it_ran_gives_back_everything():
    reservation = ratelimit.reserve_tokens(tenant_id=1, tokens=100)
    ratelimit.settle_tokens(reservation, used=0)
    settled()
    assert used(1) == 0


def test_a_request_larger_than_the_whole_budget_says_to_lower_max_tokens():
    with pytest.raises(TokensExceeded, match="more than this tenant's budget of 300 tokens"):
        ratelimit.reserve_tokens(tenant_id=1, tokens=301)
    assert used(1) == 0


def test_a_spent_budget_is_refused_before_tokenizing():
    ratelimit.reserve_tokens(tenant_id=1, tokens=300)
    with pytest.raises(TokensExceeded, match="300 tokens per minute"):
        ratelimit.check_token_budget(tenant_id=1)


def test_a_settlement_after_the_window_turned_changes_nothing(monkeypatch):
    reservation = ratelimit.reserve_tokens(tenant_id=1, tokens=100)
    monkeypatch.setattr(ratelimit.time, "time", lambda: reservation.window_end + 1)
    ratelimit._settle(reservation, 10)
    monkeypatch.undo()
    assert used(1) == 100


def test_keys_and_signed_in_users_each_have_their_own_request_count():
    for _ in range(3):
        ratelimit.check_request_rate(principal=key_principal(1, "aaaa"))
        ratelimit.check_request_rate(principal=user_principal(1, user_id=7))
    with pytest.raises(RateLimited, match="for this key"):
        ratelimit.check_request_rate(principal=key_principal(1, "aaaa"))
    with pytest.raises(RateLimited, match="for you in this tenant"):
        ratelimit.check_request_rate(principal=user_principal(1, user_id=7))
    ratelimit.check_request_rate(principal=key_principal(1, "bbbb"))
    ratelimit.check_request_rate(principal=user_principal(2, user_id=7))  # same user, other tenant
    ratelimit.check_request_rate(principal=user_principal(1, user_id=8))


def test_a_dead_cache_fails_open_counts_each_failure_and_warns_once(settings, caplog):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: connections are refused
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": f"redis://127.0.0.1:{port}/0",
            "OPTIONS": {"socket_connect_timeout": 1.0, "socket_timeout": 1.0},
        }
    }
    before = RATELIMIT_BACKEND_ERRORS._value.get()
    with caplog.at_level(logging.WARNING, logger="inference.ratelimit"):
        for _ in range(5):
            ratelimit.check_request_rate(principal=key_principal(1, "aaaa"))
            ratelimit.check_token_budget(tenant_id=1)
            assert ratelimit.reserve_tokens(tenant_id=1, tokens=300) is None
    assert RATELIMIT_BACKEND_ERRORS._value.get() - before == 15
    warnings = [r for r in caplog.records if r.name == "inference.ratelimit"]
    assert len(warnings) == 1
    assert "rate limits are not enforced" in warnings[0].getMessage()
    assert "ConnectionError" in warnings[0].getMessage()
