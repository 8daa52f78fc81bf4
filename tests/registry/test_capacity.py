"""Capacity plans from the registry: the Engines page's, run for a real engine's model,
device and settings, foresees what that engine allocated; `plan --from-registry` replays
the adapters' recent traffic."""

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest

from inference.engine import LLMEngine, SamplingParams
from inference.metrics import EngineCollector
from registry import admin_engines
from registry.capacity import engine_plan
from registry.engines import EngineState, parse_engine_info, parse_metrics, parse_pool
from registry.services.adapters import adapter_create
from tenants.selectors import requests_per_adapter
from tests.adapter_versions import create_ready_version
from tests.registry.conftest import ALICE_ACTOR
from tests.usage_records import usage_record

pytestmark = pytest.mark.django_db


def scraped(engine: LLMEngine, base_name: str) -> EngineState:
    """The engine's /metrics as the Engines page reads them."""
    registry = CollectorRegistry()
    registry.register(EngineCollector(engine.stats, lambda: base_name))
    text = generate_latest(registry).decode()
    state = EngineState(url="http://engine.test")
    state.metrics, state.hit_rates = parse_metrics(text)
    state.info = parse_engine_info(text)
    state.pool = parse_pool(text)
    return state


@pytest.fixture
def engine(base_model):
    engine = LLMEngine(model=base_model.local_path, device="cpu", enable_lora=True, max_loras=3)
    yield engine
    engine.close()


def test_the_plan_for_an_engine_matches_what_it_allocated(base_model, adapter, engine):
    state = scraped(engine, base_model.name)
    assert state.info["device_type"] == "cpu" and state.info["kv_cache_bytes"] == "0"
    shown = engine_plan(state)
    assert shown.plan is not None, shown.error
    planned = {name: (plan, reported) for name, plan, reported in shown.rows}
    assert planned["weights bytes per GPU"] == (engine.stats()["weights_bytes"],) * 2
    assert planned["KV cache blocks"] == (engine.stats()["kv_blocks_total"],) * 2
    assert planned["device adapter slots"] == (3, 3)
    assert shown.plan.host_slots == engine.config.max_cpu_loras


def test_the_plan_foresees_the_slots_a_pool_sized_engine_chose(base_model, adapter):
    engine = LLMEngine(model=base_model.local_path, device="cpu", enable_lora=True)
    try:
        state = scraped(engine, base_model.name)
        assert state.info["max_loras"] == ""  # left to the pool
        shown = engine_plan(state)
        assert shown.plan is not None, shown.error
        planned = {name: (plan, reported) for name, plan, reported in shown.rows}
        slots = engine.model_runner.pool.num_slots
        assert planned["device adapter slots"] == (slots, slots)
        assert planned["KV cache blocks"] == (engine.stats()["kv_blocks_total"],) * 2
    finally:
        engine.close()


def test_the_engines_page_shows_the_plan_beside_the_engine(base_model, engine, monkeypatch):
    state = scraped(engine, base_model.name)
    monkeypatch.setattr(admin_engines, "engine_urls", lambda: [state.url])
    monkeypatch.setattr(admin_engines, "engine_state", lambda url: state)
    client = Client()
    root = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(root)
    html = client.get("/admin/engines/").content.decode()
    assert "Capacity plan" in html and 'id="capacity-plan"' in html
    blocks = engine.stats()["kv_blocks_total"]
    assert f"<td>KV cache blocks</td><td>{blocks}</td><td>{blocks}</td>" in html


def test_the_engines_page_shows_the_pool_by_use_and_its_evictions(base_model, engine, monkeypatch):
    engine.generate([[1, 2, 3, 4, 5] * 8], SamplingParams(temperature=0, max_tokens=2))
    state = scraped(engine, base_model.name)
    pages = state.pool["pages"]
    assert set(pages) == {
        "running_kv",
        "cached_prefixes",
        "adapters_in_use",
        "adapters_idle",
        "free",
    }
    assert sum(pages.values()) == state.metrics["loraplex_pool_pages_total"]
    assert pages["cached_prefixes"] > 0  # the finished prompt's full blocks stay cached
    monkeypatch.setattr(admin_engines, "engine_urls", lambda: [state.url])
    monkeypatch.setattr(admin_engines, "engine_state", lambda url: state)
    client = Client()
    root = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(root)
    html = client.get("/admin/engines/").content.decode()
    assert 'id="memory-pool"' in html
    assert f"<td>cached_prefixes: {pages['cached_prefixes']:.0f}</td>" in html
    assert f"<td>free: {pages['free']:.0f}</td>" in html


def test_an_engine_that_reports_no_settings_gets_no_plan():
    assert "does not report" in engine_plan(EngineState(url="http://old.test")).error


def test_plan_from_registry_counts_each_adapters_recent_requests(
    tenant_a, adapter, good_adapter_dir
):
    other = adapter_create(tenant=tenant_a, name="other-bot", actor=ALICE_ACTOR)
    busy = create_ready_version(adapter, good_adapter_dir)
    quiet = create_ready_version(other, good_adapter_dir)
    for _ in range(3):
        usage_record(tenant_a, "support-bot", 10, 5, version=busy)
    usage_record(tenant_a, "other-bot", 10, 5, version=quiet)
    usage_record(tenant_a, "other-bot", 10, 5, version=quiet, days_ago=30)  # not recent
    usage_record(tenant_a, "tiny-llama", 10, 5)  # the base model: no adapter
    counts = requests_per_adapter(since=timezone.now() - timedelta(days=7))
    assert sorted(counts.values()) == [1, 3]
    out = StringIO()
    call_command("plan", "--model", "llama-3-8b", "--from-registry", "--json", stdout=out)
    d = json.loads(out.getvalue())
    assert d["device_slots"] == 2 and d["host_slots"] == 2  # one per adapter with traffic
    assert d["hit_rates"]["device"] == 1.0
