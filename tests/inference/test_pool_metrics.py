"""The memory pool on /metrics: a real engine's pages by use (adding up to the pool's pages)
and its resize and eviction counters, beside the slot gauges that were there before."""

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from inference.engine import LLMEngine, LoRARequest, SamplingParams
from inference.metrics import EngineCollector
from tests.peft_adapters import make_peft_adapter
from tests.tiny_llama import make_tiny_llama


def exported(stats: dict) -> dict[tuple[str, tuple], float]:
    registry = CollectorRegistry()
    registry.register(EngineCollector(lambda: stats, lambda: "tiny"))
    text = generate_latest(registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_pool_pages_by_use_add_up_and_its_counters_are_exported(tmp_path):
    model = make_tiny_llama(tmp_path / "model", num_layers=2)
    adapter = make_peft_adapter(model, tmp_path / "adapter", rank=8, targets=("q_proj", "v_proj"))
    engine = LLMEngine(
        model=model, enable_lora=True, block_size=4, kv_cache_bytes=1 << 20, max_lora_rank=8
    )
    lora = LoRARequest("a", "id-a", str(adapter))
    engine.generate(["hello there"], SamplingParams(max_tokens=3), lora_request=lora)
    metrics = exported(engine.stats())
    pages = metrics[("loraplex_pool_pages_total", ())]
    uses = ("running_kv", "cached_prefixes", "adapters_in_use", "adapters_idle", "free")
    by_use = {use: metrics[("loraplex_pool_pages", (("use", use),))] for use in uses}
    assert sum(by_use.values()) == pages == engine.block_manager.num_blocks
    k = metrics[("loraplex_pool_pages_per_slot", ())]
    assert by_use["adapters_idle"] == k > 0  # the adapter, done, sits idle in its slot
    resizes = ("loraplex_pool_resizes_total", (("direction", "kv_to_adapter"),))
    assert metrics[resizes] == k
    for reason in ("adapter_for_kv", "adapter_for_adapter", "prefix_for_adapter"):
        assert metrics[("loraplex_pool_evictions_total", (("reason", reason),))] == 0
    assert metrics[("loraplex_pool_blocks_moved_total", ())] == 0
    assert metrics[("loraplex_lora_slots_total", ())] == engine.model_runner.lora_slots.num_slots
    assert metrics[("loraplex_lora_slots_used", ())] == 1
    engine.close()
