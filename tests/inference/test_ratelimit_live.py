"""The limits through a live `manage.py serve`, with real (and really concurrent) requests.

Two servers: one with tight per-minute limits whose cache is a Redis of this module's own
(so the last test can kill it), one with a concurrency cap of 2. Each test has its own
tenant, so its counters start at zero.
"""

import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest
from django.conf import settings

from tests.clients import http
from tests.faults.services import RedisServer
from tests.inference.conftest import BASE_NAME, start_server, stop_server
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db  # reads only: the rows the server sees are the fixtures'

RPM, TPM = 10, 300
NAMES = ("burst", "settle", "huge", "session", "cap", "redis-down")
PROMPT = list(range(10, 30))  # token ids: exactly 20 prompt tokens


@dataclass
class Caller:
    tenant_id: int
    slug: str
    key: str
    session: dict  # cookies and headers of a signed-in member, as the playground sends them


@pytest.fixture(scope="module")
def callers(serve_data, django_db_blocker):
    """name -> a fresh tenant with an API key and a signed-in member, committed before the
    tests (whose own writes stay in their transaction, unseen by the server)."""
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.utils.crypto import get_random_string

    from tenants.models import Tenant
    from tenants.services import api_key_create, tenant_create, user_get_or_create

    slugs = []

    def make(name: str) -> Caller:
        slug = f"rl-{name}"
        with django_db_blocker.unblock():
            user = user_get_or_create(email=f"{slug}@example.com", password=None)
            tenant = tenant_create(slug=slug, owner=user)
            _, key = api_key_create(tenant=tenant, name="rl", scopes=["inference", "registry:read"])
            browser = Client()
            browser.force_login(user)
        slugs.append(slug)
        csrf = get_random_string(32)
        session = {
            "cookies": {
                settings.SESSION_COOKIE_NAME: browser.cookies[settings.SESSION_COOKIE_NAME].value,
                settings.CSRF_COOKIE_NAME: csrf,
            },
            "headers": {"X-CSRFToken": csrf, "X-Loraplex-Tenant": slug},
        }
        return Caller(tenant_id=tenant.id, slug=slug, key=key, session=session)

    yield {name: make(name) for name in NAMES}
    with django_db_blocker.unblock():
        Tenant.objects.filter(slug__in=slugs).delete()
        get_user_model().objects.filter(username__in=[f"{s}@example.com" for s in slugs]).delete()


@pytest.fixture(scope="module")
def redis(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def limited(serve_data, redis):
    """A server with RPM and TPM limits, its cache on the module's own Redis."""
    url, proc, log = start_server(
        serve_data["tmp"],
        {
            "REDIS_URL": redis.url,
            "LORAPLEX_RATE_LIMIT_RPM": str(RPM),
            "LORAPLEX_RATE_LIMIT_TPM": str(TPM),
        },
    )
    yield url, log
    stop_server(proc)


def complete(url: str, *, key: str | None = None, session: dict | None = None, **body):
    """POST /v1/completions with a key or a session; the httpx response."""
    body = {"model": BASE_NAME, "prompt": PROMPT, "max_tokens": 1, "temperature": 0, **body}
    if key is not None:
        return httpx.post(
            f"{url}/v1/completions",
            json=body,
            headers={"Authorization": f"Bearer {key}"},
            timeout=120,
        )
    assert session is not None
    return httpx.post(
        f"{url}/v1/completions",
        json=body,
        cookies=session["cookies"],
        headers=session["headers"],
        timeout=120,
    )


def code(response: httpx.Response) -> str | None:
    return response.json()["error"]["code"] if response.status_code >= 400 else None


def fresh_window(margin: float = 15.0) -> None:
    """Sleep into the next minute if this one ends within `margin` s (counters are per minute)."""
    left = 60 - time.time() % 60
    if left < margin:
        time.sleep(left + 0.2)


def burst(n: int, send):
    """Send n requests at once from n threads; their responses."""
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: send(), range(n)))


def test_a_burst_of_concurrent_requests_admits_only_what_fits_the_token_budget(limited, callers):
    url, _ = limited
    caller = callers["burst"]
    fresh_window()
    # Each may use 20 + 120 = 140 tokens, and uses all of them: 2 fit in 300, 10 do not.
    responses = burst(10, lambda: complete(url, key=caller.key, max_tokens=120, ignore_eos=True))
    admitted = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code == 429]
    assert len(admitted) == 2, [(r.status_code, r.text[:200]) for r in responses]
    assert len(refused) == 8 and {code(r) for r in refused} == {"tokens_exceeded"}
    assert all(int(r.headers["Retry-After"]) >= 1 for r in refused)
    # Refused at the reservation ("may use 140 tokens (prompt + max_tokens)"), or earlier when
    # others' reservations already filled the budget: either way, the tenant's minute.
    assert all("tokens per minute" in r.json()["error"]["message"] for r in refused)
    assert sum(r.json()["usage"]["total_tokens"] for r in admitted) == 280 <= TPM


def test_what_a_request_did_not_use_goes_back_to_the_budget(limited, callers):
    url, _ = limited
    caller = callers["settle"]
    fresh_window()
    # Greedy decoding is deterministic: the first tokens' text, as a stop sequence, ends
    # the next request after a few tokens although it may use 200.
    probe = complete(url, key=caller.key, max_tokens=4)
    text = probe.json()["choices"][0]["text"]
    whole = text.split("\ufffd")[0]  # up to the first incomplete character, if any
    stop = whole[: max(1, len(whole) // 2)]
    assert stop, f"the probe's text {text!r} cannot serve as a stop sequence"
    short = complete(url, key=caller.key, max_tokens=200, stop=[stop])
    assert short.status_code == 200, short.text
    assert short.json()["usage"]["completion_tokens"] < 10
    time.sleep(0.5)  # settling runs in the background, after the answer
    # Reserved 20 + 4, then 20 + 200 of which ~180 came back: another 220 fits in 300.
    again = complete(url, key=caller.key, max_tokens=200, stop=[stop])
    assert again.status_code == 200, again.text


def test_a_request_larger_than_the_whole_budget_is_refused_saying_why(limited, callers):
    url, _ = limited
    caller = callers["huge"]
    response = complete(url, key=caller.key, max_tokens=TPM)
    assert response.status_code == 429 and code(response) == "tokens_exceeded"
    assert "lower max_tokens" in response.json()["error"]["message"]


def test_a_signed_in_member_is_limited_per_minute_too(limited, callers):
    url, _ = limited
    caller = callers["session"]
    fresh_window()
    for _ in range(RPM):
        response = complete(url, session=caller.session)
        assert response.status_code == 200, response.text
    refused = complete(url, session=caller.session)
    assert refused.status_code == 429 and code(refused) == "rate_limit_exceeded"
    assert f"{RPM} requests per minute for you in this tenant" in refused.json()["error"]["message"]
    assert int(refused.headers["Retry-After"]) >= 1
    assert complete(url, key=caller.key).status_code == 200  # the tenant's key counts apart


@pytest.fixture(scope="module")
def capped(serve_data):
    """A server where a tenant runs at most 2 requests at once (no per-minute limits)."""
    url, proc, log = start_server(
        serve_data["tmp"],
        {
            "LORAPLEX_TENANT_MAX_CONCURRENCY": "2",
            "LORAPLEX_RATE_LIMIT_RPM": "0",
            "LORAPLEX_RATE_LIMIT_TPM": "0",
        },
    )
    yield url
    stop_server(proc)


def test_concurrent_requests_past_the_cap_are_429_and_each_served_one_is_metered(capped, callers):
    caller = callers["cap"]
    responses = burst(6, lambda: complete(capped, key=caller.key, max_tokens=150, ignore_eos=True))
    served = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code == 429]
    assert 1 <= len(served) <= 2 and len(served) + len(refused) == 6, [
        (r.status_code, r.text[:200]) for r in responses
    ]
    assert {code(r) for r in refused} == {"concurrency_exceeded"}
    assert "at most 2 at once per tenant" in refused[0].json()["error"]["message"]
    assert all(r.headers["Retry-After"] == "1" for r in refused)
    assert complete(capped, key=caller.key).status_code == 200  # the slots came back

    def usage():
        response = http(capped, "GET", "/api/v1/usage/", key=caller.key)
        assert response.status_code == 200, response.text
        return response.json()["data"]

    # One record per served request, none for refusals. Records are written in the order the
    # requests ended: once the last request's is in, every earlier one's is too.
    expected = {
        "adapter": BASE_NAME,
        "version": None,
        "requests": len(served) + 1,
        "prompt_tokens": len(PROMPT) * (len(served) + 1),
        "completion_tokens": 150 * len(served) + 1,
    }
    wait_for(
        lambda: sum(row["requests"] for row in usage()) >= expected["requests"],
        what="every served request metered",
    )
    (row,) = usage()
    assert {k: row[k] for k in expected} == expected


@pytest.mark.skipif(
    os.environ.get("LORAPLEX_REQUIRE_SERVICES") != "1", reason="CI only: REDIS_URL is set there"
)
def test_ci_keeps_the_rate_limit_counters_in_redis():
    from django.core.cache import caches
    from django.core.cache.backends.redis import RedisCache

    cache = caches["default"]
    assert isinstance(cache, RedisCache), type(cache)
    cache.set("loraplex-ci-probe", 1, timeout=5)
    assert cache.get("loraplex-ci-probe") == 1


def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", headers=metrics_headers(), timeout=10).text
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def metrics_headers() -> dict:
    token = os.environ.get("LORAPLEX_METRICS_TOKEN") or os.environ.get("LORAPLEX_OPERATOR_TOKEN")
    return {"Authorization": f"Bearer {token}"} if token else {}


def test_redis_dying_while_serving_fails_open_counts_logs_and_recovers(limited, redis, callers):
    """Runs last in this module: it kills the Redis the `limited` server uses."""
    url, log = limited
    caller = callers["redis-down"]
    fresh_window(margin=12)
    assert complete(url, key=caller.key).status_code == 200
    before = metric(url, "loraplex_ratelimit_backend_errors_total")

    redis.kill()
    served = [complete(url, key=caller.key).status_code for _ in range(RPM + 2)]
    assert served == [200] * (RPM + 2)  # fail open: more than the limit, all served
    errors = metric(url, "loraplex_ratelimit_backend_errors_total") - before
    assert errors >= RPM + 2  # at least the request count of each one
    warnings = [
        line for line in log.read_text().splitlines() if "rate limits are not enforced" in line
    ]
    assert len(warnings) == 1, warnings  # once a minute, not once a request

    redis.start()  # back, and empty: the limits apply again from zero
    statuses = [complete(url, key=caller.key).status_code for _ in range(RPM + 1)]
    assert statuses == [200] * RPM + [429]
