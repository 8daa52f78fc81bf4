"""One pool for KV blocks and adapter slots (memory_pool.py): outputs stay those of each
request alone however the pool is split, and those of the fixed split (reserved slots); a
request longer than the KV cache a fixed split leaves runs while few adapters are active;
adapters arriving take free pages and cached prefixes, and move running blocks out of their
slot group, never taking them; an adapter in use is never evicted; a pin that would leave no
room for the longest request is refused; the pages by use add up."""

from collections.abc import Callable

import pytest

from inference.engine import EngineRequest, LLMEngine, SamplingParams
from inference.engine.errors import ConfigError, InvalidRequestError
from tests.engine.lora_fixtures import ALL_LINEAR, lora_engine, request_for

BLOCK = 4
NAMES = [f"p{i}" for i in range(5)]


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, logprobs=4)


@pytest.fixture(scope="module")
def loras(adapters):
    return {n: request_for(n, adapters(n, rank=8, alpha=16, targets=ALL_LINEAR)) for n in NAMES}


@pytest.fixture(scope="module")
def geometry(lora_model_dir):
    """(page bytes, pages a slot takes) of the tiny model at rank 8."""
    probe = lora_engine(lora_model_dir, block_size=BLOCK, max_lora_rank=8, max_loras=1)
    geometry = probe.config.kv_block_bytes, probe.block_manager.layout.pages_per_slot
    probe.close()
    return geometry


def pool_engine(model_dir, pages: int | Callable[[int], int], **kwargs) -> LLMEngine:
    """An engine whose pool holds exactly `pages` pages (the LoRA scratch and arena on top);
    a function of the pages a slot takes when they are not known yet."""
    kwargs.update(block_size=BLOCK, max_lora_rank=8)
    probe = lora_engine(model_dir, **kwargs)
    runner = probe.model_runner  # a page and the scratch are one rank's, under parallelism
    page_bytes, reserved = runner.kv_cache[0].nbytes, runner.lora_bytes
    if callable(pages):
        pages = pages(probe.block_manager.layout.pages_per_slot)
    probe.close()
    engine = lora_engine(model_dir, kv_cache_bytes=reserved + pages * page_bytes, **kwargs)
    assert engine.block_manager.num_blocks == pages
    return engine


def add(engine, rid, ids, lora=None, n=6):
    engine.add_request(
        EngineRequest(rid, prompt_token_ids=ids, sampling_params=greedy(n), lora_request=lora)
    )


def step(engine, results: dict) -> None:
    """One engine step (waiting for a load when nothing could run), outputs gathered."""
    steps = engine.num_steps
    outputs = engine.step()
    if not outputs and engine.num_steps == steps:
        engine.wait_for_load(0.05)
    for out in outputs:
        r = results.setdefault(out.request_id, {"tokens": [], "logprobs": []})
        r["tokens"] += out.new_token_ids
        r["logprobs"] += [[lp for _, lp in t.top] for t in out.new_logprobs]
    check_pool_adds_up(engine)


def run_all(engine, results=None, max_steps=5000) -> dict:
    results = {} if results is None else results
    for _ in range(max_steps):
        if not engine.has_unfinished():
            return results
        step(engine, results)
    raise AssertionError("the engine did not finish")


def check_pool_adds_up(engine) -> None:
    pool = engine.stats()["pool"]
    assert sum(pool["by_use"].values()) == pool["pages"] == engine.block_manager.num_blocks
    assert all(count >= 0 for count in pool["by_use"].values())


@pytest.fixture(scope="module")
def alone(lora_model_dir):
    """Each (prompt, adapter, tokens) request's tokens and top logprobs, run by itself on an
    engine with room for everything (nothing moves or is evicted)."""
    engine = lora_engine(lora_model_dir, block_size=BLOCK, max_lora_rank=8, max_loras=1)
    cache: dict = {}

    def run(ids: list[int], lora=None, n: int = 6) -> dict:
        key = (tuple(ids), lora.adapter_id if lora else None, n)
        if key not in cache:
            add(engine, "alone", ids, lora, n)
            cache[key] = run_all(engine)["alone"]
        return cache[key]

    yield run
    engine.close()


def assert_same(got: dict, want: dict) -> None:
    assert got["tokens"] == want["tokens"]
    for mine, theirs in zip(got["logprobs"], want["logprobs"], strict=True):
        assert mine == pytest.approx(theirs, abs=1e-5, rel=0)


def prompt(i: int, length: int) -> list[int]:
    return [(7 * i + j) % 300 + 5 for j in range(length)]


def test_outputs_under_churn_equal_each_request_alone(lora_model_dir, loras, geometry, alone):
    """Five adapters and the base model on a pool the pool itself splits into three slots
    and a few KV blocks: adapters evict each other, idle ones give pages to KV, running
    blocks move. Every request's tokens and logprobs are those it makes alone."""
    _, k = geometry
    engine = pool_engine(lora_model_dir, 3 * k + 24, max_cpu_loras=8)
    assert engine.model_runner.lora_slots.num_slots == 3  # (3k + 23) // k, the pool's choice
    jobs = churn_jobs()
    results: dict = {}
    for rid, ids, name in jobs[:6]:
        add(engine, rid, ids, loras.get(name))
    for _ in range(6):
        step(engine, results)
    for rid, ids, name in jobs[6:]:
        add(engine, rid, ids, loras.get(name))
    run_all(engine, results)
    for rid, ids, name in jobs:
        assert_same(results[rid], alone(ids, loras.get(name)))
    pool = engine.stats()["pool"]
    assert pool["evictions"]["adapter_for_adapter"] > 0
    assert pool["resizes"]["kv_to_adapter"] > 0 and pool["resizes"]["adapter_to_kv"] > 0


def test_few_adapters_leave_the_kv_cache_the_slots_pages(lora_model_dir, loras, geometry, alone):
    """Four slots and 20 blocks beside them: a fixed split would hold 80 tokens of KV; with
    one adapter active a 200-token request runs beside it, on the idle slots' pages."""
    _, k = geometry
    assert 4 * k > 60  # the long request needs pages of the slot groups
    engine = pool_engine(lora_model_dir, 4 * k + 20, max_loras=4)
    long_ids = prompt(1, 190)
    add(engine, "adapter", prompt(2, 12), loras["p0"], n=20)
    add(engine, "long", long_ids, n=10)
    results = run_all(engine)
    assert engine.scheduler.num_preemptions == 0
    assert_same(results["long"], alone(long_ids, n=10))
    assert_same(results["adapter"], alone(prompt(2, 12), loras["p0"], n=20))


def test_arriving_adapters_take_free_and_cached_pages(lora_model_dir, loras, geometry, alone):
    """Base requests fill the pool, slot groups included, with cached prefixes; then as many
    adapters as slots arrive: the prefixes in their groups are forgotten for them, the
    others stay cached."""
    _, k = geometry
    engine = pool_engine(lora_model_dir, 3 * k + 10, max_loras=3)
    bm = engine.block_manager
    for i in range(6):  # (3k + 10) pages of named prefixes, from outside the groups up
        add(engine, f"base{i}", prompt(10 + i, (3 * k + 10) * BLOCK // 6 - 4), n=2)
    run_all(engine)
    groups = [bm.layout.slot_pages(s) for s in range(3)]
    assert all(bm.cached_in(pages) for pages in groups)  # the groups hold cached prefixes
    results: dict = {}
    for i, name in enumerate(NAMES[:3]):
        add(engine, f"a{i}", prompt(i, 10), loras[name])
    run_all(engine, results)
    pool = engine.stats()["pool"]
    assert pool["evictions"]["prefix_for_adapter"] > 0
    assert pool["by_use"]["adapters_idle"] == 3 * k
    assert bm.num_cached_blocks > 0  # prefixes outside the groups are still there
    for i, name in enumerate(NAMES[:3]):
        assert_same(results[f"a{i}"], alone(prompt(i, 10), loras[name]))


@pytest.mark.parametrize("ranks", [1, 2])
def test_running_blocks_move_out_of_a_slot_group_exactly(lora_model_dir, loras, alone, ranks):
    """A running request whose blocks sit in the only slot's group: an adapter arriving
    moves them to pages outside (one copy each) rather than waiting or taking them, and the
    request's output is what it makes alone; under tensor parallelism every rank moves them.
    (The adapter's request then decodes beside it, so the moved pages are read again.)"""
    engine = pool_engine(lora_model_dir, lambda k: k + 12, max_loras=1, tensor_parallel_size=ranks)
    bm = engine.block_manager
    outside = bm.num_blocks - bm.layout.pages_per_slot
    group = set(bm.layout.slot_pages(0))
    first_ids, long_ids = prompt(3, outside * BLOCK - 2), prompt(4, 20)
    add(engine, "first", first_ids, n=2)  # takes every page outside the group
    add(engine, "long", long_ids, n=30)  # so its blocks go to the group's pages
    results: dict = {}
    while "first" not in results or len(results["first"]["tokens"]) < 2:
        step(engine, results)
    long_seq = engine.requests["long"]
    assert set(long_seq.block_table) <= group
    add(engine, "adapter", prompt(5, 9), loras["p1"])
    while engine.lora_manager.adapters["id-p1"].slot is None:
        step(engine, results)
    moved = engine.stats()["pool"]["blocks_moved"]
    assert moved > 0 and not set(long_seq.block_table) & group
    run_all(engine, results)
    assert_same(results["long"], alone(long_ids, n=30))
    assert_same(results["first"], alone(first_ids, n=2))
    assert_same(results["adapter"], alone(prompt(5, 9), loras["p1"]))
    engine.close()


def test_an_adapter_in_use_is_never_evicted_for_kv(lora_model_dir, loras, geometry, alone):
    """Two slots, a running adapter and an idle one; base requests need more blocks than
    are free: the idle adapter gives its pages back, the running one keeps its slot (the
    base requests wait or are preempted rather than take it)."""
    _, k = geometry
    engine = pool_engine(lora_model_dir, 2 * k + 8, max_loras=2)
    add(engine, "idle", prompt(6, 8), loras["p2"], n=2)
    run_all(engine)
    busy_ids = prompt(7, 8)
    add(engine, "busy", busy_ids, loras["p3"], n=60)
    results: dict = {}
    busy = engine.lora_manager.adapters["id-p3"]
    while busy.slot is None:  # loading
        step(engine, results)
    slot = busy.slot
    base = [prompt(20 + i, 4 * k // 3) for i in range(3)]
    for i, ids in enumerate(base):
        add(engine, f"base{i}", ids, n=4)
    while engine.requests.get("busy") is not None and not engine.requests["busy"].is_finished:
        step(engine, results)
        assert busy.slot == slot  # in use: never evicted, never moved
    run_all(engine, results)
    pool = engine.stats()["pool"]
    assert pool["evictions"]["adapter_for_kv"] >= 1
    assert engine.lora_manager.adapters["id-p2"].slot is None  # the idle one gave way
    assert_same(results["busy"], alone(busy_ids, loras["p3"], n=60))
    for i, ids in enumerate(base):
        assert_same(results[f"base{i}"], alone(ids, n=4))


def test_the_pool_decides_the_slot_count_without_max_loras(lora_model_dir, geometry):
    _, k = geometry
    engine = pool_engine(lora_model_dir, 5 * k + 3, max_cpu_loras=4)
    assert engine.model_runner.lora_slots.num_slots == 4  # capped by the host cache
    assert engine.config.max_loras is None
    engine = pool_engine(lora_model_dir, 2 * k + 3)
    assert engine.model_runner.lora_slots.num_slots == 2  # all the pool holds
    stats = engine.stats()
    assert stats["lora"]["slots_total"] == 2
    assert stats["pool"]["by_use"]["free"] == 2 * k + 3


def churn_jobs() -> list[tuple[str, list[int], str | None]]:
    return [(f"r{i}", prompt(i, 14 + 3 * i), ([None] + NAMES)[i % 6]) for i in range(12)]


def test_reserved_slots_are_a_fixed_split_with_the_same_outputs(
    lora_model_dir, loras, geometry, alone
):
    """reserve_lora_slots: the three slots' pages are the adapters' from the start, full or
    empty; the KV side only ever has the rest (so a sequence can be no longer), nothing is
    resized, and every output is the one the pool gives (each request's alone)."""
    _, k = geometry
    engine = pool_engine(lora_model_dir, 3 * k + 24, max_loras=3, reserve_lora_slots=True)
    bm = engine.block_manager
    assert bm.num_free_blocks == 24 and bm.max_seq_blocks() == bm.max_seq_blocks(True) == 24
    assert engine.max_seq_len == 24 * BLOCK
    assert engine.stats()["pool"]["by_use"] == {
        "running_kv": 0, "cached_prefixes": 0, "adapters_in_use": 0,
        "adapters_idle": 3 * k, "free": 24,
    }  # fmt: skip
    results: dict = {}
    for rid, ids, name in churn_jobs():
        add(engine, rid, ids, loras.get(name))
    while engine.has_unfinished():
        step(engine, results)
        assert bm.num_lent_pages == 3 * k and bm.num_used_blocks <= 24
    for rid, ids, name in churn_jobs():
        assert_same(results[rid], alone(ids, loras.get(name)))
    pool = engine.stats()["pool"]
    assert pool["resizes"] == {"kv_to_adapter": 0, "adapter_to_kv": 0}
    assert pool["evictions"]["adapter_for_kv"] == 0 and pool["blocks_moved"] == 0
    assert pool["evictions"]["adapter_for_adapter"] > 0  # five adapters through three slots


def test_reserved_slots_need_max_loras_and_a_switch(lora_model_dir):
    with pytest.raises(ConfigError, match="reserve_lora_slots needs max_loras"):
        lora_engine(lora_model_dir, max_lora_rank=8, reserve_lora_slots=True)
    with pytest.raises(ConfigError, match="reserve_lora_slots must be true or false"):
        lora_engine(lora_model_dir, max_loras=2, reserve_lora_slots="yes")


def test_a_pin_never_leaves_the_longest_request_without_room(
    lora_model_dir, loras, geometry, alone
):
    """A pinned adapter's pages never serve as KV, so a pin that would leave the pool too
    small for the longest request the engine accepts is refused (a request that long would
    wait at the head of the queue with everyone behind it); the refusal changes nothing, and
    requests of the longest length run beside the pins that were allowed."""
    _, k = geometry
    engine = pool_engine(lora_model_dir, 128 + 2 * k + 4, max_loras=4)
    assert engine.max_seq_len == engine.max_adapter_seq_len == 128 * BLOCK  # max_model_len
    engine.load_lora(loras["p0"], pin=True)
    engine.load_lora(loras["p1"])
    with pytest.raises(InvalidRequestError, match="cannot pin adapter 'p1': with 2 adapter"):
        engine.pin_lora("id-p1")
    with pytest.raises(InvalidRequestError, match="fewer than the 512 the engine accepts"):
        engine.load_lora(loras["p2"], pin=True)
    listed = {a["name"]: a["pinned"] for a in engine.list_loras()}
    assert listed == {"p0": True, "p1": False}
    jobs = [
        ("long-base", prompt(1, 128 * BLOCK - 6), None),
        ("long-p1", prompt(2, 127 * BLOCK - 6), "p1"),
        ("short-p0", prompt(3, 9), "p0"),
        ("short-base", prompt(4, 9), None),
    ]
    for rid, ids, name in jobs:
        add(engine, rid, ids, loras.get(name), n=4)
    results = run_all(engine)
    for rid, ids, name in jobs:
        assert_same(results[rid], alone(ids, loras.get(name), n=4))
    engine.pin_lora("id-p0", pinned=False)
    engine.pin_lora("id-p1")  # one pin at a time fits
    assert {a["name"] for a in engine.list_loras() if a["pinned"]} == {"p1"}
    engine.close()
