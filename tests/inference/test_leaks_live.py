"""Through a live `manage.py serve` (the tiny model, a real adapter): what /metrics, the operator
listing, error pages and out-of-range numbers give away to whoever asks.

Two servers on the same rows: the embedded default (no metrics token) and one configured as
production would be (LORAPLEX_METRICS_TOKEN set), each scraped while a tenant's adapter runs.
"""

import json
from contextlib import contextmanager

import httpx
import pytest

from tests.clients import chat, chat_stream
from tests.inference.conftest import start_server, stop_server

OPERATOR = "operator-token-for-the-live-tests-0123456789"
METRICS = "metrics-token-for-the-live-tests-0123456789"
ADAPTER = "serve-a/pirate:1"  # what the engine calls the adapter serve_data uploads

# The servers read rows committed by the module's fixtures; tests change them only over HTTP.
pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def open_server(serve_data):
    url, proc, _ = start_server(serve_data["tmp"], {"LORAPLEX_OPERATOR_TOKEN": OPERATOR})
    yield url
    stop_server(proc)


@pytest.fixture(scope="module")
def guarded_server(serve_data):
    env = {"LORAPLEX_OPERATOR_TOKEN": OPERATOR, "LORAPLEX_METRICS_TOKEN": METRICS}
    url, proc, _ = start_server(serve_data["tmp"], env)
    yield url
    stop_server(proc)


@contextmanager
def adapter_running(url: str, key: str):
    """A stream on the tenant's adapter, open (its first tokens read) for the body's duration."""
    story = [{"role": "user", "content": "Tell me a long story"}]
    with chat_stream(url, key, model="pirate", messages=story) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        for _ in range(3):
            next(lines)
        yield


def router_gauge(text: str) -> str:
    (line,) = [x for x in text.splitlines() if x.startswith("vllm:lora_requests_info{")]
    return line


def test_open_metrics_name_no_tenant_or_adapter(open_server, serve_data):
    key = serve_data["keys"][0]
    with adapter_running(open_server, key):
        text = httpx.get(f"{open_server}/metrics", timeout=10).text
    assert 'running_lora_adapters=""' in router_gauge(text)
    assert "loraplex_requests_running 1.0" in text  # scraped while the adapter ran
    assert "serve-a" not in text and "pirate" not in text


def test_guarded_metrics_answer_only_the_token_and_then_name_the_adapters(
    guarded_server, serve_data
):
    for headers in ({}, {"Authorization": "Bearer guess"}, {"Authorization": f"Bearer {OPERATOR}"}):
        refused = httpx.get(f"{guarded_server}/metrics", headers=headers, timeout=10)
        assert refused.status_code == 401, headers
        assert refused.headers["WWW-Authenticate"] == 'Bearer realm="loraplex"'
        assert refused.json()["error"]["code"] == "metrics_token_required"
        assert "vllm:" not in refused.text
    key = serve_data["keys"][0]
    with adapter_running(guarded_server, key):
        text = httpx.get(
            f"{guarded_server}/metrics", headers={"Authorization": f"Bearer {METRICS}"}, timeout=10
        ).text
    assert 'running_lora_adapters="pirate"' in router_gauge(text)  # the `model` it sent


def test_the_operator_listing_shows_no_local_paths(open_server, serve_data):
    assert chat(open_server, serve_data["keys"][0], model="pirate", max_tokens=2).status_code == 200
    response = httpx.get(
        f"{open_server}/v1/lora_adapters",
        headers={"Authorization": f"Bearer {OPERATOR}"},
        timeout=10,
    )
    assert response.status_code == 200
    (adapter,) = [a for a in response.json()["data"] if a["name"] == ADAPTER]
    assert adapter["tier"] and "path" not in adapter
    assert "adapter-cache" not in response.text and str(serve_data["tmp"]) not in response.text


@pytest.mark.parametrize("seed", [2**64, 2**63, -1])
def test_a_seed_out_of_range_is_a_400_and_the_server_keeps_serving(open_server, serve_data, seed):
    """2**64 overflowed torch.Generator.manual_seed: a 500 (with DEBUG's page, once)."""
    key = serve_data["keys"][0]
    response = chat(open_server, key, model="pirate", seed=seed, max_tokens=2)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "seed"
    assert chat(open_server, key, model="pirate", seed=2**63 - 1, max_tokens=2).status_code == 200


def test_deeply_nested_json_is_a_400(open_server, serve_data):
    response = httpx.post(
        f"{open_server}/v1/chat/completions",
        content=b"[" * 50_000,
        timeout=30,
        headers={
            "Authorization": f"Bearer {serve_data['keys'][0]}",
            "Content-Type": "application/json",
        },
    )
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_json"


def test_no_debug_pages_by_default_even_for_localhost(open_server):
    """DEBUG was on unless LORAPLEX_ENV=production: Django's technical pages for anyone."""
    missing = httpx.get(f"{open_server}/no/such/page", headers={"Host": "localhost"}, timeout=10)
    assert missing.status_code == 404
    assert "URLconf" not in missing.text and "DEBUG = True" not in missing.text
    # ... and the pages still get their style sheets without DEBUG (no collectstatic here).
    css = httpx.get(f"{open_server}/static/admin/css/base.css", timeout=10)
    assert css.status_code == 200 and "body" in css.text


def test_readyz_says_ok_and_lists_names_only(open_server):
    body = httpx.get(f"{open_server}/readyz", timeout=10).json()
    assert body["status"] == "ok" and all(isinstance(c, str) for c in body["checks"])
    assert json.dumps(body).count("://") == 0
