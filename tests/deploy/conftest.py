"""What a real engine exports on /metrics: the names every rule, dashboard and router
configuration in deploy/ may use."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from inference.engine import EngineRequest, SamplingParams
from inference.metrics import EngineCollector
from tests.engine.lora_fixtures import lora_engine, request_for, run_all
from tests.peft_adapters import make_peft_adapter
from tests.tiny_llama import make_tiny_llama


@pytest.fixture(scope="session")
def exported_samples(tmp_path_factory) -> set[str]:
    """Sample names (`_bucket`, `_total` and all) of a tiny LoRA engine's exposition, after one
    adapter request, rendered by the collector `/metrics` uses."""

    root = tmp_path_factory.mktemp("exposition")
    model = make_tiny_llama(root / "model", num_layers=1)
    adapter = make_peft_adapter(model, root / "adapter", rank=4, seed=1)
    engine = lora_engine(model, max_loras=2, max_cpu_loras=2)
    try:
        params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
        engine.add_request(
            EngineRequest("r", "hello", params, lora_request=request_for("t/a", adapter))
        )
        assert run_all(engine)["r"]["error"] is None
        registry = CollectorRegistry()
        registry.register(EngineCollector(engine.stats, lambda: "tiny"))
        text = generate_latest(registry).decode()
    finally:
        engine.close()
    return {
        sample.name for family in text_string_to_metric_families(text) for sample in family.samples
    }
