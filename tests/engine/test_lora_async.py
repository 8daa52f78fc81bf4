"""The LoRA controls on AsyncLLMEngine: they run on the step thread between steps and answer
with futures; stats carry what the Prometheus exporter reads."""

import asyncio

import pytest

from inference.engine import (
    AdapterLoadError,
    AsyncLLMEngine,
    EngineRequest,
    EngineStoppedError,
    InvalidRequestError,
    SamplingParams,
)
from tests.engine.lora_fixtures import GREEDY, lora_engine, request_for

LORA_KEYS = {
    "lookups",
    "hits",
    "loads",
    "load_failures",
    "evictions",
    "slots_used",
    "slots_total",
    "host_bytes",
    "extras_bytes_used",
    "adapters_waiting",
    "running_adapters",
    "waiting_adapter_names",
    "running_model_names",
    "waiting_model_names",
}


@pytest.fixture
def engine(lora_model_dir):
    engine = AsyncLLMEngine(lora_engine(lora_model_dir, max_loras=2, max_cpu_loras=2))
    yield engine
    engine.shutdown()


def test_load_pin_list_unload_through_the_step_thread(engine, adapters, tmp_path):
    req = request_for("x", adapters("x", rank=8, targets=("q_proj", "v_proj")))
    other = request_for("w", adapters("w", rank=4, targets=("o_proj",)))

    async def main():
        assert await engine.load_lora(req) is None
        [entry] = await engine.list_loras()
        assert (entry["name"], entry["tier"], entry["pinned"], entry["rank"]) == (
            "x",
            "host",
            False,
            8,
        )
        await engine.pin_lora(req.adapter_id)
        [entry] = await engine.list_loras()  # pinned: swapped into a free slot at once
        assert (entry["tier"], entry["pinned"], entry["slot"]) == ("device", True, 0)
        with pytest.raises(InvalidRequestError, match="not known"):
            await engine.pin_lora("id-nope")
        with pytest.raises(InvalidRequestError, match="one slot must stay free"):
            await engine.load_lora(other, pin=True)  # max_loras 2: one may be pinned
        with pytest.raises(AdapterLoadError, match="does not exist"):
            await engine.load_lora(request_for("gone", tmp_path / "gone"))
        await engine.pin_lora(req.adapter_id, pinned=False)
        await engine.load_lora(other, pin=True)
        tiers = {a["name"]: (a["tier"], a["pinned"]) for a in await engine.list_loras()}
        assert tiers == {"x": ("device", False), "w": ("device", True)}
        assert await engine.unload_lora(req.adapter_id) is True
        assert await engine.unload_lora(req.adapter_id) is False
        assert [a["name"] for a in await engine.list_loras()] == ["w"]
        with pytest.raises(InvalidRequestError, match="must be a LoRARequest"):
            await engine.load_lora("x")

    asyncio.run(main())


def test_stats_carry_the_lora_metrics(engine, adapters):
    req = request_for("y", adapters("y", rank=4, targets=("o_proj",)))

    async def main():
        long = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
        stream = engine.generate(EngineRequest("r", "hello", long, lora_request=req))
        first = await stream.__anext__()
        during = engine.stats()["lora"]
        rest = [o async for o in stream]
        return [first, *rest], during

    outs, during = asyncio.run(main())
    assert outs[-1].finish_reason == "length"
    assert during["running_adapters"] == ["y"] and during["slots_used"] == 1
    stats = engine.stats()
    assert set(stats["lora"]) == LORA_KEYS and stats["lora"]["slots_total"] == 2
    assert stats["lora"]["lookups"] == {"device": 1, "host": 1, "disk": 1}
    assert stats["lora"]["hits"] == {"device": 0, "host": 0, "disk": 1, "loader": 0}
    for key in ("lora_swap_in", "lora_load"):
        assert stats[key]["count"] == 1 and stats[key]["buckets"][-1] == (float("inf"), 1)


def test_after_shutdown_the_engine_is_not_alive_and_refuses_calls(engine, adapters):
    assert engine.is_alive()
    engine.shutdown()
    assert not engine.is_alive()
    with pytest.raises(EngineStoppedError):
        asyncio.run(engine.load_lora(request_for("z", adapters("z", rank=4))))

    async def late():
        engine.generate(EngineRequest("late", "hello", GREEDY))

    with pytest.raises(EngineStoppedError):
        asyncio.run(late())
