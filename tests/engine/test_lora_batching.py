"""Multi-LoRA batching: adapters mixed in one batch change nobody's output; more adapters than
device slots and host entries still all finish (with evictions, pinned ones staying); one
load serves many requests; an adapter waiting for a slot is never starved."""

import asyncio
import threading

import pytest

from inference.engine import AsyncLLMEngine, EngineRequest, SamplingParams
from tests.engine.lora_fixtures import (
    ALL_LINEAR,
    ATTENTION,
    GREEDY,
    PROMPTS,
    lora_engine,
    request_for,
    run_all,
)

NAMES = [f"a{i}" for i in range(6)]


@pytest.fixture(scope="module")
def requests(adapters):
    """Six adapters of mixed ranks and target sets, by name."""
    return {
        name: request_for(
            name,
            adapters(
                name, rank=(4, 8, 16)[i % 3], alpha=16, targets=ALL_LINEAR if i % 2 else ATTENTION
            ),
        )
        for i, name in enumerate(NAMES)
    }


@pytest.fixture(scope="module")
def alone(lora_model_dir, requests):
    """Each (prompt, adapter) pair's greedy tokens, run with nothing else in the engine."""
    engine = lora_engine(lora_model_dir, max_loras=1)
    result = {}
    for name in [None, *NAMES]:
        for prompt in PROMPTS:
            lora = requests.get(name)
            result[(prompt, name)] = engine.generate([prompt], GREEDY, lora_request=lora)[
                0
            ].token_ids
    engine.close()
    return result


def add_all(engine, pairs, requests):
    for i, (prompt, name) in enumerate(pairs):
        engine.add_request(EngineRequest(f"{i}", prompt, GREEDY, lora_request=requests.get(name)))


def test_four_adapters_and_base_in_one_batch_equal_each_alone(lora_model_dir, requests, alone):
    engine = lora_engine(lora_model_dir, max_loras=4)
    pairs = [(p, n) for p in PROMPTS for n in (None, *NAMES[:4])]
    add_all(engine, pairs, requests)
    batch_sizes = []
    original_run = engine.model_runner.run

    def run(batch):
        batch_sizes.append(len({s.lora_slot for s in batch.seqs}))
        return original_run(batch)

    engine.model_runner.run = run
    results = run_all(engine)
    assert {pairs[int(r)]: v["tokens"] for r, v in results.items()} == {
        pair: alone[pair] for pair in pairs
    }
    assert max(batch_sizes) == 5  # four adapters and the base shared steps
    assert engine.stats()["lora"]["loads"] == 4


def test_more_adapters_than_slots_and_host_entries_all_finish(lora_model_dir, requests, alone):
    engine = lora_engine(lora_model_dir, max_loras=2, max_cpu_loras=3, max_num_seqs=4)
    pinned = requests["a0"]
    future = engine.load_lora(pinned)
    run_all(engine)
    assert future.result() is None
    engine.pin_lora(pinned.adapter_id)
    engine.step()  # a pinned adapter goes into a free slot at the next step
    pairs = [(p, n) for p in PROMPTS for n in NAMES] + [(p, None) for p in PROMPTS[:2]]
    add_all(engine, pairs, requests)
    results, distinct = {}, []
    while engine.has_unfinished():
        outputs = engine.step()
        if not outputs:
            engine.wait_for_load(0.05)
        tiers = {a["adapter_id"]: a for a in engine.list_loras()}
        assert tiers[pinned.adapter_id]["tier"] == "device"
        assert tiers[pinned.adapter_id]["slot"] is not None
        distinct.append(len({s.lora_request for s in engine.scheduler.running}))
        for out in outputs:
            assert out.error is None
            results.setdefault(pairs[int(out.request_id)], []).extend(out.new_token_ids)
    assert results == {pair: alone[pair] for pair in pairs}
    assert max(distinct) <= 3  # two adapters (max_loras) plus the base model
    lora = engine.stats()["lora"]
    assert lora["evictions"]["device"] > 0 and lora["evictions"]["host"] > 0
    assert lora["slots_used"] <= 2 and lora["slots_total"] == 2
    assert len([a for a in engine.list_loras() if a["tier"] != "disk"]) <= 2 + 3
    assert engine.block_manager.num_used_blocks == 0


def test_fifty_simultaneous_requests_for_a_cold_adapter_share_one_load(
    lora_model_dir, requests, alone
):
    adapter = requests["a3"]
    calls, lock = [], threading.Lock()
    release = threading.Event()

    def loader(req):
        with lock:
            calls.append(req.adapter_id)
        release.wait(30)  # hold the load open until every request has arrived
        return adapter.path

    engine = AsyncLLMEngine(lora_engine(lora_model_dir, max_loras=2, lora_loader=loader))
    cold = type(adapter)(adapter.name, adapter.adapter_id, None)  # no path: ask the loader

    async def one(i):
        stream = engine.generate(EngineRequest(f"r{i}", PROMPTS[i % 5], GREEDY, lora_request=cold))
        return [t async for o in stream for t in o.new_token_ids]

    async def main():
        tasks = [asyncio.create_task(one(i)) for i in range(50)]
        while engine.stats()["lora"]["waiting_adapter_names"] != [cold.name] or (
            engine.stats()["requests_waiting"] < 50
        ):
            await asyncio.sleep(0.01)
        release.set()
        return await asyncio.gather(*tasks)

    try:
        results = asyncio.run(main())
    finally:
        engine.shutdown()
    assert calls == [cold.adapter_id]
    assert results == [alone[(PROMPTS[i % 5], "a3")] for i in range(50)]
    lora = engine.stats()["lora"]
    assert lora["loads"] == 1 and lora["hits"]["loader"] == 1
    assert lora["lookups"]["device"] == lora["lookups"]["host"] == 50


def test_no_starvation_while_other_adapters_keep_arriving(lora_model_dir, requests, alone):
    """Requests for a0 and a1 keep arriving (a0 at steps 0, 3, 6, ..., a1 at 1, 4, 7, ...), so
    each always has requests running and neither slot ever falls idle on its own; a request
    for a2 still gets a slot within a bounded number of steps, and the others keep going."""
    engine = lora_engine(lora_model_dir, max_loras=2, max_num_seqs=64)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    for name in ("a0", "a1", "a2"):
        engine.load_lora(requests[name])
    run_all(engine)  # all three in host memory: a2 waits for a slot only
    first_token_step, starved_tokens, arrival, others_after = None, [], 12, 0
    for step in range(300):
        if step % 3 < 2:
            name = ("a0", "a1")[step % 3]
            engine.add_request(
                EngineRequest(f"{step}", PROMPTS[step % 5], params, lora_request=requests[name])
            )
        if step == arrival:
            # both slots are held by adapters with running requests: no slot is idle
            assert {s.lora_request.name for s in engine.scheduler.running} == {"a0", "a1"}
            engine.add_request(
                EngineRequest("starved", PROMPTS[0], GREEDY, lora_request=requests["a2"])
            )
        outputs = engine.step()
        starved_tokens += [t for o in outputs if o.request_id == "starved" for t in o.new_token_ids]
        if first_token_step is not None:  # a step after a2's first token
            others_after += sum(1 for o in outputs if o.request_id != "starved")
        if first_token_step is None and starved_tokens:
            first_token_step = step
        if first_token_step is not None and step > first_token_step + 3:
            break
    assert first_token_step is not None, "the request for a2 never got a slot"
    # The slot that frees soonest is drained: its adapter takes no newcomers, its running
    # requests finish their max_tokens (a decode at least every other step), then a2 is in.
    assert first_token_step - arrival <= 3 * (params.max_tokens + 1)
    assert others_after >= 3  # a0 and a1 kept producing tokens next to it
    starved_tokens += run_all(engine).get("starved", {"tokens": []})["tokens"]
    assert starved_tokens == alone[(PROMPTS[0], "a2")]


def test_tier_lookups_and_hits_are_counted(lora_model_dir, requests):
    engine = lora_engine(lora_model_dir, max_loras=1, max_cpu_loras=2)
    a, b = requests["a0"], requests["a1"]
    engine.generate(["hello"], GREEDY, lora_request=a)  # disk -> host -> slot
    engine.generate(["hello"], GREEDY, lora_request=a)  # still in its slot
    engine.generate(["hello"], GREEDY, lora_request=b)  # disk; evicts a from the slot
    engine.generate(["hello"], GREEDY, lora_request=a)  # back from host memory
    lora = engine.stats()["lora"]
    assert lora["lookups"] == {"device": 4, "host": 3, "disk": 2}
    assert lora["hits"] == {"device": 1, "host": 1, "disk": 2, "loader": 0}
    assert lora["evictions"] == {"device": 2, "host": 0} and lora["loads"] == 2
    stats = engine.stats()
    assert stats["lora_load"]["count"] == 2 and stats["lora_swap_in"]["count"] == 3
    tiers = {x["name"]: (x["tier"], x["rank"]) for x in engine.list_loras()}
    assert tiers == {"a0": ("device", 4), "a1": ("host", 8)}
