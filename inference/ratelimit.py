"""Per-caller request limits and per-tenant token budgets, per minute, in the shared cache.

Fixed one-minute windows with atomic counters (`add` then `incr`), so every replica that
shares the cache (Redis in production) sees the same count. Requests count per API key,
or per signed-in user and tenant (the playground). Tokens are reserved when a request is
admitted, as much as it may use (each choice's prompt and max_tokens: every engine request
reads its prompt, so each of `n` choices or `best_of` candidates of an 8k-token prompt costs
eight thousand tokens), and settled when it ends (the unused part goes back): a burst of
concurrent requests cannot overshoot the budget, because a reservation that passes it is
taken back and refused.

When the cache fails (Redis down), the limits fail open: requests are served, each
failure counts in `loraplex_ratelimit_backend_errors_total`, and a warning is logged at
most once a minute. Authentication never reads the cache, so only the limits lapse.
The concurrency cap is per process and needs no backend.
"""

import contextlib
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from django.conf import settings
from django.core.cache import cache

from tenants.principal import Principal

from .errors import ConcurrencyExceeded, RateLimited, TokensExceeded
from .metrics import RATELIMIT_BACKEND_ERRORS

log = logging.getLogger(__name__)
WINDOW_SECONDS = 60
WARN_EVERY_SECONDS = 60.0
T = TypeVar("T")

_warned_at: float | None = None
_warn_lock = threading.Lock()
# Settling runs after the response, off the event loop: a slow cache must not stall streams.
_settler = ThreadPoolExecutor(max_workers=1, thread_name_prefix="loraplex-ratelimit")


@dataclass(frozen=True)
class Reservation:
    """Tokens set aside in one window's counter, until `settle_tokens` trues them up."""

    key: str
    tokens: int
    window_end: float


def _window() -> tuple[int, int]:
    """(start of this minute's window, whole seconds until the next one)."""
    now = time.time()
    start = int(now // WINDOW_SECONDS) * WINDOW_SECONDS
    return start, max(1, int(start + WINDOW_SECONDS - now + 0.999))


def _shared(operation: Callable[[], T]) -> T | None:
    """Run one cache operation; None when the backend failed (the limit is then skipped)."""
    try:
        return operation()
    except Exception as exc:  # redis.ConnectionError, TimeoutError, ...: fail open
        RATELIMIT_BACKEND_ERRORS.inc()
        global _warned_at
        with _warn_lock:
            now = time.monotonic()
            if _warned_at is not None and now - _warned_at < WARN_EVERY_SECONDS:
                return None
            _warned_at = now
        log.warning(
            "rate limits are not enforced: the cache backend failed (%s: %s); serving anyway "
            "(counted in loraplex_ratelimit_backend_errors_total, logged once a minute)",
            type(exc).__name__,
            exc,
        )
        return None


def _incr(key: str, amount: int) -> int | None:
    def operation() -> int:
        cache.add(key, 0, timeout=WINDOW_SECONDS * 2)
        try:
            return cache.incr(key, amount)
        except ValueError:  # expired between add and incr
            cache.set(key, amount, timeout=WINDOW_SECONDS * 2)
            return amount

    return _shared(operation)


def _adjust(key: str, delta: int) -> None:
    """Add to a counter that exists; a gone one (expired, Redis restarted) stays gone."""

    def operation() -> None:
        with contextlib.suppress(ValueError):
            cache.incr(key, delta)

    _shared(operation)


def _caller(principal: Principal) -> str:
    if principal.api_key is not None:
        return f"key:{principal.api_key.prefix}"
    assert principal.user is not None, "a principal is an API key or a signed-in user"
    return f"user:{principal.user.pk}:{principal.tenant.id}"


def check_request_rate(*, principal: Principal) -> None:
    """Count one request for this API key, or this signed-in user in this tenant."""
    limit = settings.RATE_LIMIT_REQUESTS_PER_MINUTE
    if not limit:
        return
    start, retry_after = _window()
    count = _incr(f"rl:req:{_caller(principal)}:{start}", 1)
    if count is not None and count > limit:
        who = "this key" if principal.api_key is not None else "you in this tenant"
        raise RateLimited(
            f"Rate limit reached: {limit} requests per minute for {who}.",
            retry_after=retry_after,
        )


def check_token_budget(*, tenant_id: int) -> None:
    """Refuse early, before any tokenizing, when the tenant's budget is already spent."""
    limit = settings.RATE_LIMIT_TOKENS_PER_MINUTE
    if not limit:
        return
    start, retry_after = _window()
    used = _shared(lambda: cache.get(f"rl:tok:{tenant_id}:{start}", 0))
    if used is not None and used >= limit:
        raise TokensExceeded(
            f"Token limit reached: {limit} tokens per minute for this tenant.",
            retry_after=retry_after,
        )


def reserve_tokens(*, tenant_id: int, tokens: int) -> Reservation | None:
    """Set aside the most this request can use (each choice's prompt and max_tokens) or
    refuse it.

    Returns None when there is nothing to settle (no limit, or the backend is down).
    """
    limit = settings.RATE_LIMIT_TOKENS_PER_MINUTE
    if not limit:
        return None
    start, retry_after = _window()
    if tokens > limit:
        raise TokensExceeded(
            f"This request may use {tokens} tokens (each choice's prompt and max_tokens), more "
            f"than this tenant's budget of {limit} tokens per minute; lower max_tokens (or n, "
            "best_of, the prompt).",
            retry_after=retry_after,
        )
    key = f"rl:tok:{tenant_id}:{start}"
    used = _incr(key, tokens)
    if used is None:
        return None
    if used > limit:
        _adjust(key, -tokens)
        left = max(0, limit - (used - tokens))
        raise TokensExceeded(
            f"Token limit reached: this request may use {tokens} tokens (each choice's prompt and "
            f"max_tokens) and {left} of this tenant's {limit} tokens per minute are left.",
            retry_after=retry_after,
        )
    return Reservation(key=key, tokens=tokens, window_end=start + WINDOW_SECONDS)


def settle_tokens(reservation: Reservation | None, *, used: int) -> None:
    """Give back what the request did not use, in the background; never raises."""
    if reservation is not None and used != reservation.tokens:
        _settler.submit(_settle, reservation, used)


def _settle(reservation: Reservation, used: int) -> None:
    if time.time() < reservation.window_end:  # a window that has turned counts no more
        _adjust(reservation.key, used - reservation.tokens)


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
