"""The engine's prefix cache counters (in tokens) on /metrics, under our names and vLLM v1's,
and on the admin's Engines page with their hit rate. (Counted live by a real engine in
tests/inference/openai/test_n_choices.py.)"""

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from inference.metrics import EngineCollector
from registry.engines import EngineState, parse_metrics
from tests.ui import engine_recorder
from tests.ui.engine_recorder import MODEL_NAME, STATS, start_recorder

PREFIX = {"prefix_cache_queries": 4000, "prefix_cache_hits": 3000, "prefix_cache_blocks": 12}


def samples(stats: dict) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(EngineCollector(lambda: stats, lambda: MODEL_NAME))
    text = generate_latest(registry).decode()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels in ({}, {"model_name": MODEL_NAME})  # ours, vLLM's
    }


def test_the_prefix_cache_counters_are_exported_under_both_names():
    exported = samples({**STATS, **PREFIX})
    assert exported["loraplex_prefix_cache_queries_total"] == 4000
    assert exported["loraplex_prefix_cache_hits_total"] == 3000
    assert exported["loraplex_prefix_cache_blocks"] == 12
    assert exported["vllm:prefix_cache_queries_total"] == 4000  # vLLM v1's counters
    assert exported["vllm:prefix_cache_hits_total"] == 3000


def test_an_engine_without_them_exports_zeros():
    exported = samples(STATS)
    assert exported["loraplex_prefix_cache_queries_total"] == 0
    assert exported["vllm:prefix_cache_hits_total"] == 0


def test_the_engine_state_computes_the_hit_rate():
    registry = CollectorRegistry()
    registry.register(EngineCollector(lambda: {**STATS, **PREFIX}, lambda: MODEL_NAME))
    metrics, _ = parse_metrics(generate_latest(registry).decode())
    state = EngineState(url="http://engine", metrics=metrics)
    assert state.prefix_cache == {"queries": 4000, "hits": 3000, "rate": 0.75, "blocks": 12}
    assert EngineState(url="http://engine").prefix_cache["rate"] is None  # no lookup yet


@pytest.mark.django_db
def test_the_engines_page_shows_the_prefix_cache(admin_client, settings, monkeypatch):
    monkeypatch.setattr(engine_recorder, "STATS", {**STATS, **PREFIX})  # what it scrapes
    recorder, server = start_recorder()
    settings.ENGINE_URLS = [recorder.url]
    try:
        html = admin_client.get("/admin/engines/").content.decode()
    finally:
        server.shutdown()
        server.server_close()
    assert "prefix cache: prompt tokens looked up / found</th><td>4000 / 3000</td>" in html
    assert "prefix cache hit rate</th><td>75%</td>" in html
    assert "prefix cache blocks</th><td>12</td>" in html
