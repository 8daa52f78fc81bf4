"""Per-key request and per-tenant token limits, per minute, in the shared cache (Redis in production).

Fixed one-minute windows with atomic counters (`add` then `incr`), so every web replica
sees the same count. Token use is charged when a request finishes; a tenant over its
budget is refused until the window turns. The concurrency cap is per process: it keeps
one tenant from filling this engine's batch.
"""

import time
from collections import defaultdict

from django.conf import settings
from django.core.cache import cache

from .errors import ConcurrencyExceeded, RateLimited, TokensExceeded

WINDOW_SECONDS = 60


def _window() -> tuple[int, int]:
    now = time.time()
    start = int(now // WINDOW_SECONDS) * WINDOW_SECONDS
    return start, max(1, int(start + WINDOW_SECONDS - now + 0.999))


def _incr(key: str, amount: int) -> int:
    cache.add(key, 0, timeout=WINDOW_SECONDS * 2)
    try:
        return cache.incr(key, amount)
    except ValueError:  # expired between add and incr
        cache.set(key, amount, timeout=WINDOW_SECONDS * 2)
        return amount


def check_request_rate(*, key_id: str) -> None:
    """Count one request for this key; refuse it past the per-minute limit."""
    limit = settings.RATE_LIMIT_REQUESTS_PER_MINUTE
    if not limit:
        return
    start, retry_after = _window()
    if _incr(f"rl:req:{key_id}:{start}", 1) > limit:
        raise RateLimited(
            f"Rate limit reached: {limit} requests per minute for this key.",
            retry_after=retry_after,
        )


def check_token_budget(*, tenant_id: int) -> None:
    limit = settings.RATE_LIMIT_TOKENS_PER_MINUTE
    if not limit:
        return
    start, retry_after = _window()
    used = cache.get(f"rl:tok:{tenant_id}:{start}", 0)
    if used >= limit:
        raise TokensExceeded(
            f"Token limit reached: {limit} tokens per minute for this tenant.",
            retry_after=retry_after,
        )


def charge_tokens(*, tenant_id: int, tokens: int) -> None:
    if settings.RATE_LIMIT_TOKENS_PER_MINUTE and tokens:
        start, _ = _window()
        _incr(f"rl:tok:{tenant_id}:{start}", tokens)


_in_flight: dict[int, int] = defaultdict(int)


def acquire_slot(tenant_id: int) -> None:
    """Take one of the tenant's concurrent-request slots in this process (release_slot frees it)."""
    cap = settings.TENANT_MAX_CONCURRENCY
    if cap and _in_flight[tenant_id] >= cap:
        raise ConcurrencyExceeded(
            f"Too many concurrent requests: at most {cap} at once per tenant.", retry_after=1
        )
    _in_flight[tenant_id] += 1


def release_slot(tenant_id: int) -> None:
    _in_flight[tenant_id] -= 1
