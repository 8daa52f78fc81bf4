"""Automatic prefix caching: a request reuses the KV blocks of a prefix computed before,
under the same adapter only, and nothing it computes differs from computing it all."""

import pytest
import torch

from inference.engine import EngineRequest, LLMEngine, SamplingParams
from inference.engine.block_manager import BlockManager
from tests.engine.lora_fixtures import GREEDY, lora_engine, request_for, run_all
from tests.engine.stepping import step_logits

BLOCK = 4
SYSTEM = list(range(10, 47))  # 37 tokens: nine full blocks and one token more
LONG = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def requests(adapters):
    return {n: request_for(n, adapters(n, rank=8, alpha=16)) for n in ("pc0", "pc1")}


def make_engine(model_dir, **kwargs) -> LLMEngine:
    kwargs.setdefault("block_size", BLOCK)
    return lora_engine(model_dir, max_loras=2, **kwargs)


def add(engine, rid, ids, lora=None, params=LONG):
    engine.add_request(
        EngineRequest(rid, prompt_token_ids=ids, sampling_params=params, lora_request=lora)
    )


def logits_per_step(engine, rid, ids, lora=None, steps=4) -> list[torch.Tensor]:
    """The request's logits at its prefill and at each decode step (greedy), alone."""
    add(engine, rid, ids, lora)
    rows: list[torch.Tensor] = []
    while len(rows) < steps:
        for seq, row in step_logits(engine):
            rows.append(row)
            seq.token_ids.append(int(row.argmax()))
    engine.abort(rid)
    engine.step()  # hands over the abort
    return rows


def first_step(engine):
    """Step until a forward pass ran (adapters may be loading first)."""
    steps, outputs = engine.num_steps, []
    while engine.num_steps == steps:
        outputs += engine.step()
        if engine.num_steps == steps:
            engine.wait_for_load(0.05)
    return {out.request_id: out.new_token_ids for out in outputs}


def assert_all_free(engine):
    bm = engine.block_manager
    assert bm.num_used_blocks == 0
    assert all(b.ref_count == 0 for b in bm.blocks)
    # the pages adapters in slots borrowed from the pool are theirs, not requests'
    assert len(bm.free_blocks) + len(bm.cached_free) + bm.num_lent_pages == bm.num_blocks


@pytest.mark.parametrize("adapter", [None, "pc0"])
def test_logits_with_a_cached_prefix_equal_logits_without(lora_model_dir, requests, adapter):
    lora = requests.get(adapter)
    cached = make_engine(lora_model_dir)
    plain = make_engine(lora_model_dir, enable_prefix_caching=False)
    run_all_ids(cached, SYSTEM + [100, 101], lora)  # the system prompt is now cached
    question = SYSTEM + [200, 201, 202, 203, 204]
    with_cache = logits_per_step(cached, "q", question, lora)
    assert cached.requests == {} and cached.stats()["prefix_cache_hits"] == 36
    without = logits_per_step(plain, "q", question, lora)
    for a, b in zip(with_cache, without, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def run_all_ids(engine, ids, lora=None, rid="warm"):
    add(engine, rid, ids, lora)
    return run_all(engine)[rid]["tokens"]


def test_two_adapters_and_the_base_never_share_blocks(lora_model_dir, requests):
    engine = make_engine(lora_model_dir)
    futures = [engine.load_lora(requests[name]) for name in ("pc0", "pc1")]
    while not all(f.done() for f in futures):
        engine.step()  # takes the finished loads in
        engine.wait_for_load(0.05)
    for name in ("pc0", "pc1", None):
        add(engine, f"r-{name}", SYSTEM, requests.get(name))
    first_step(engine)  # all three admitted in one step
    seqs = list(engine.requests.values())
    assert [s.num_cached_tokens for s in seqs] == [0, 0, 0]
    tables = [set(s.block_table) for s in seqs]
    assert not (tables[0] & tables[1] or tables[0] & tables[2] or tables[1] & tables[2])
    run_all(engine)
    for name in ("pc1", None, "pc0"):  # each finds its own blocks only
        add(engine, f"again-{name}", SYSTEM + [5], requests.get(name))
        first_step(engine)
        assert engine.requests[f"again-{name}"].num_cached_tokens == 36
    run_all(engine)
    assert_all_free(engine)


def test_requests_admitted_together_share_the_prefix_blocks(lora_model_dir, requests):
    """Like n > 1: the first one computes the prompt, the others reuse its blocks at once."""
    engine = make_engine(lora_model_dir)
    alone = run_all_ids(make_engine(lora_model_dir), SYSTEM, requests["pc0"])
    for i in range(3):
        add(engine, f"c{i}", SYSTEM, requests["pc0"])
    firsts = first_step(engine)
    first, *others = engine.requests.values()
    assert first.num_cached_tokens == 0 and [s.num_cached_tokens for s in others] == [36, 36]
    assert all(s.block_table[:9] == first.block_table[:9] for s in others)
    assert all(engine.block_manager.blocks[b].ref_count == 3 for b in first.block_table[:9])
    results = run_all(engine)
    assert [firsts[f"c{i}"] + results[f"c{i}"]["tokens"] for i in range(3)] == [alone] * 3
    assert_all_free(engine)


def test_a_prompt_that_is_a_prefix_of_another(lora_model_dir):
    engine = make_engine(lora_model_dir)
    plain = make_engine(lora_model_dir, enable_prefix_caching=False)
    run_all_ids(engine, SYSTEM)
    for n in (37, 36, 33, 32, 9, 5):  # a cached prompt itself, or cut inside a block
        ids = SYSTEM[:n]
        tokens = run_all_ids(engine, ids, rid=f"p{n}")
        assert tokens == run_all_ids(plain, ids, rid=f"p{n}")
    # a prompt of whole cached blocks still computes its last token (for its logits)
    add(engine, "whole", SYSTEM[:36])
    engine.step()
    assert engine.requests["whole"].num_cached_tokens == 32
    run_all(engine)


def test_a_prompt_shorter_than_a_block_caches_nothing(lora_model_dir):
    engine = make_engine(lora_model_dir)
    one = SamplingParams(temperature=0, max_tokens=1)
    add(engine, "short", [7, 8, 9], params=one)
    first = run_all(engine)["short"]["tokens"]
    assert engine.stats()["prefix_cache_blocks"] == 0  # three tokens fill no block
    add(engine, "again", [7, 8, 9], params=one)
    assert run_all(engine)["again"]["tokens"] == first
    assert engine.stats()["prefix_cache_hits"] == 0


def test_abort_in_the_middle_of_a_shared_prefix(lora_model_dir):
    engine = make_engine(lora_model_dir)
    alone = run_all_ids(make_engine(lora_model_dir), SYSTEM + [1, 2])
    add(engine, "a", SYSTEM + [1, 2])
    add(engine, "b", SYSTEM + [1, 2])
    tokens = engine.step() + engine.step()
    shared = engine.requests["a"].block_table[:9]
    assert engine.requests["b"].block_table[:9] == shared
    engine.abort("a")
    assert all(engine.block_manager.blocks[b].ref_count == 1 for b in shared)
    b_tokens = [t for out in tokens if out.request_id == "b" for t in out.new_token_ids]
    assert b_tokens + run_all(engine)["b"]["tokens"] == alone
    assert_all_free(engine)


def test_preemption_in_the_middle_of_a_shared_prefix(lora_model_dir):
    """A cache so small that decodes preempt: outputs stay those of each request alone, the
    counts end at zero, and a preempted request finds its own blocks again."""
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    alone = {}
    reference = make_engine(lora_model_dir, enable_prefix_caching=False)
    for i in range(3):
        add(reference, f"r{i}", SYSTEM[:20] + [60 + i], params=params)
        alone[f"r{i}"] = run_all(reference)[f"r{i}"]["tokens"]
    # base-model requests only: an engine without LoRA, whose pool holds 18 blocks exactly
    block_bytes = engine_block_bytes(lora_model_dir)
    engine = base_engine(lora_model_dir, 18 * block_bytes)
    assert engine.block_manager.num_blocks == 18
    for i in range(3):
        add(engine, f"r{i}", SYSTEM[:20] + [60 + i], params=params)
    results = run_all(engine)
    assert engine.scheduler.num_preemptions > 0
    assert {rid: r["tokens"] for rid, r in results.items()} == alone
    assert engine.stats()["prefix_cache_hits"] > 2 * 20 - 8  # the shared 5 blocks, twice
    assert_all_free(engine)


def engine_block_bytes(model_dir) -> int:
    return make_engine(model_dir).config.kv_block_bytes


def base_engine(model_dir, kv_cache_bytes: int) -> LLMEngine:
    return LLMEngine(model=model_dir, block_size=BLOCK, kv_cache_bytes=kv_cache_bytes)


def test_eviction_under_pressure_takes_the_least_recently_used(lora_model_dir):
    block_bytes = engine_block_bytes(lora_model_dir)
    engine = base_engine(lora_model_dir, 12 * block_bytes)
    plain = make_engine(lora_model_dir, enable_prefix_caching=False)
    prompts = [[100 + 10 * i + j for j in range(16)] for i in range(4)]  # 4 blocks each
    for i, ids in enumerate(prompts):
        assert run_all_ids(engine, ids, rid=f"p{i}") == run_all_ids(plain, ids, rid=f"p{i}")
    bm = engine.block_manager
    assert bm.num_cached_blocks <= bm.num_blocks == 12
    assert bm.num_used_blocks == 0
    # the oldest prompt's blocks went first; the newest one's are still there
    add(engine, "old", prompts[0])
    add(engine, "new", prompts[3])
    engine.step()
    assert engine.requests["old"].num_cached_tokens == 0
    assert engine.requests["new"].num_cached_tokens == 12
    run_all(engine)
    assert_all_free(engine)


def test_unloading_an_adapter_frees_its_blocks(lora_model_dir, requests):
    engine = make_engine(lora_model_dir)
    run_all_ids(engine, SYSTEM, requests["pc0"])
    run_all_ids(engine, SYSTEM, requests["pc1"], rid="other")
    bm = engine.block_manager
    mine = {b for b in bm.by_hash.values() if bm.blocks[b].adapter_id == "id-pc0"}
    assert len(mine) >= 9
    before = len(bm.free_blocks)
    assert engine.unload_lora("id-pc0") is True
    assert not any(bm.blocks[b].adapter_id == "id-pc0" for b in bm.by_hash.values())
    # its cached blocks and its slot's pages (lent to it from the pool) are free again
    assert len(bm.free_blocks) == before + len(mine) + bm.layout.pages_per_slot
    assert any(bm.blocks[b].adapter_id == "id-pc1" for b in bm.by_hash.values())
    add(engine, "reloaded", SYSTEM, requests["pc0"])
    run_all(engine)
    assert engine.block_manager.stats.hits == 0


def test_prefix_caching_can_be_turned_off(lora_model_dir):
    engine = make_engine(lora_model_dir, enable_prefix_caching=False)
    run_all_ids(engine, SYSTEM)
    run_all_ids(engine, SYSTEM, rid="again")
    stats = engine.stats()
    assert stats["prefix_cache_hits"] == 0 and stats["prefix_cache_blocks"] == 0


def test_block_names_chain_the_whole_prefix_and_the_adapter():
    bm = BlockManager(num_blocks=8, block_size=2)

    class Seq:
        def __init__(self, ids, adapter=None):
            self.token_ids, self.block_hashes, self.hash_root = ids, [], None
            self.lora_request = None if adapter is None else type("L", (), {"adapter_id": adapter})

        def __len__(self):
            return len(self.token_ids)

    a = bm.hashes(Seq([1, 2, 3, 4]))
    b = bm.hashes(Seq([9, 2, 3, 4]))  # same second block, different first
    c = bm.hashes(Seq([1, 2, 3, 4], adapter="x"))
    assert a[0] != b[0] and a[1] != b[1]
    assert a[0] != c[0] and a[1] != c[1]
    assert bm.hashes(Seq([1, 2, 3, 4, 5])) == a


def test_greedy_outputs_with_and_without_caching_agree(lora_model_dir, requests):
    """Many requests with shared prefixes, adapters mixed, arriving while others decode."""
    prompts = [(SYSTEM[: 8 + 3 * i] + [150 + i], ("pc0", "pc1", None)[i % 3]) for i in range(9)]

    def run(engine):
        results = {}
        for i, (ids, name) in enumerate(prompts):
            add(engine, f"r{i}", ids, requests.get(name), params=GREEDY)
            for out in engine.step():
                results.setdefault(out.request_id, []).extend(out.new_token_ids)
        for rid, r in run_all(engine).items():
            results.setdefault(rid, []).extend(r["tokens"])
        return results

    cached = make_engine(lora_model_dir)
    assert run(cached) == run(make_engine(lora_model_dir, enable_prefix_caching=False))
    assert cached.stats()["prefix_cache_hits"] > 0
    assert_all_free(cached)
