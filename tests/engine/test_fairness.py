"""Fairness across tenants: admission takes turns between fairness keys, oldest first within
a key, so one tenant's burst cannot fill the batch ahead of another's requests."""

import asyncio

import pytest

from inference.engine import AsyncLLMEngine, EngineRequest, LLMEngine, SamplingParams

PARAMS = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(lora_model_dir):
    return lora_model_dir


def admitted_in_order(engine: LLMEngine) -> list[str]:
    """Request ids in the order steps admitted them."""
    order = []
    while engine.has_unfinished():
        known = set(engine.requests)
        before = {id(s) for s in engine.scheduler.running}
        batch = engine.scheduler.schedule()
        order += [s.request_id for s in batch.seqs if id(s) not in before]
        engine.run_batch(batch)
        assert set(engine.requests) <= known
    return order


def test_a_burst_from_one_tenant_does_not_go_ahead_of_another(model_dir):
    engine = LLMEngine(model=model_dir, kv_cache_bytes=1 << 20, max_num_seqs=2)
    for i in range(6):
        engine.add_request(EngineRequest(f"a{i}", "hello", PARAMS, fairness_key="tenant-a"))
    for i in range(2):
        engine.add_request(EngineRequest(f"b{i}", "hello", PARAMS, fairness_key="tenant-b"))
    engine.add_request(EngineRequest("c0", "hello", PARAMS, fairness_key="tenant-c"))
    # each round takes one request per key, keys in the order of their oldest request
    assert admitted_in_order(engine) == ["a0", "b0", "a1", "b1", "a2", "c0", "a3", "a4", "a5"]


def test_without_keys_requests_are_first_come_first_served(model_dir):
    engine = LLMEngine(model=model_dir, kv_cache_bytes=1 << 20, max_num_seqs=3)
    ids = [f"r{i}" for i in range(7)]
    for rid in ids:
        engine.add_request(EngineRequest(rid, "hello", PARAMS))
    assert admitted_in_order(engine) == ids


def test_async_generate_passes_the_key_through(model_dir):
    engine = AsyncLLMEngine.from_config(model=model_dir, kv_cache_bytes=1 << 20)

    async def main():
        keys = []
        params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
        outs = []
        async for out in engine.generate(
            EngineRequest("k", "hello", params, fairness_key="tenant-a")
        ):
            outs.append(out)
            seq = engine.engine.requests.get("k")
            keys.append(seq.fairness_key if seq is not None else None)
        return outs, keys

    try:
        outs, keys = asyncio.run(main())
        assert outs[-1].finish_reason == "length" and engine.is_alive()
        assert keys[0] == "tenant-a"
    finally:
        engine.shutdown()
    assert not engine.is_alive()
