"""/metrics: with LORAPLEX_METRICS_TOKEN only its holder may scrape (and sees adapter names);
without it (the embedded default) anyone may, and no tenant or adapter name is shown."""

import pytest
from django.test import Client
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from inference.metrics import EngineCollector
from tests.ui.engine_recorder import MODEL_NAME, STATS

TOKEN = "metrics-token-for-the-tests-0123456789"


def scrape(**headers):
    return Client().get("/metrics", headers=headers)


def router_labels(collector_registry) -> dict:
    text = generate_latest(collector_registry).decode()
    (family,) = [
        f for f in text_string_to_metric_families(text) if f.name == "vllm:lora_requests_info"
    ]
    (sample,) = family.samples
    return sample.labels


@pytest.fixture
def engine_stats():
    """The collector over an engine-shaped stats dict with two tenants' adapters at work."""
    registry = CollectorRegistry()
    registry.register(EngineCollector(lambda: STATS, lambda: MODEL_NAME))
    return registry


def test_without_a_token_metrics_answer_anyone(settings):
    settings.METRICS_TOKEN = ""
    response = scrape()
    assert response.status_code == 200
    assert "loraplex_http_requests" in response.content.decode()


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer wrong-token", f"Basic {TOKEN}", f"Bearer {TOKEN}x", "Bearer "],
)
def test_with_a_token_anything_else_is_401(settings, authorization):
    settings.METRICS_TOKEN = TOKEN
    headers = {"Authorization": authorization} if authorization is not None else {}
    response = scrape(**headers)
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Bearer realm="loraplex"'
    error = response.json()["error"]
    assert (
        error["code"] == "metrics_token_required" and "LORAPLEX_METRICS_TOKEN" in error["message"]
    )
    assert "loraplex_" not in response.content.decode()


def test_with_a_token_its_holder_scrapes(settings):
    settings.METRICS_TOKEN = TOKEN
    response = scrape(Authorization=f"Bearer {TOKEN}")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")


def test_without_a_token_the_router_gauge_names_no_adapter(settings, engine_stats):
    settings.METRICS_TOKEN = ""
    labels = router_labels(engine_stats)
    assert labels == {"running_lora_adapters": "", "waiting_lora_adapters": "", "max_lora": "8"}
    text = generate_latest(engine_stats).decode()
    assert "tenant-a" not in text and "support-bot" not in text
    assert "loraplex_lora_waiting_adapters 1.0" in text  # counts stay


def test_with_a_token_the_router_gauge_names_the_adapters(settings, engine_stats):
    settings.METRICS_TOKEN = TOKEN
    assert router_labels(engine_stats) == {
        "running_lora_adapters": "support-bot",
        "waiting_lora_adapters": "other@canary",
        "max_lora": "8",
    }
