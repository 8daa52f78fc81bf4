"""A step's prefill tokens are shared between tenants: another tenant's short request starts
in the next step beside a long prompt's prefill, the long prompt keeps advancing every step,
and every output is the one each request gets alone."""

import pytest

from inference.engine import ConfigError, EngineRequest, LLMEngine, Priority, SamplingParams
from inference.engine.sequence import Sequence
from tests.engine.lora_fixtures import run_all

BUDGET = 32
THRESHOLD = 4
PARAMS = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


def engine_for(model_dir, **kwargs) -> LLMEngine:
    kwargs.setdefault("max_num_batched_tokens", BUDGET)
    kwargs.setdefault("long_prefill_token_threshold", THRESHOLD)
    kwargs.setdefault("kv_cache_bytes", 4 << 20)
    kwargs.setdefault("block_size", 4)
    kwargs.setdefault("max_num_seqs", 8)
    kwargs.setdefault("prefill_cost_context", 0)  # shares in tokens; by cost: the test below
    return LLMEngine(model=model_dir, **kwargs)


def prompt(n: int, start: int = 20) -> list[int]:
    return [start + i % 300 for i in range(n)]


def add(engine, rid, ids, tenant, params=PARAMS, priority=Priority.DEFAULT):
    engine.add_request(
        EngineRequest(
            rid, None, params, prompt_token_ids=ids, fairness_key=tenant, priority=priority
        )  # fmt: skip
    )


def step(engine: LLMEngine) -> tuple[dict[str, int], dict[str, list[int]]]:
    """One step: the tokens it feeds per request, and the tokens it samples per request."""
    batch = engine.scheduler.schedule()
    fed = {seq.request_id: n for seq, n in batch.entries()}
    sampled: dict[str, list[int]] = {}
    for out in engine.run_batch(batch):
        sampled.setdefault(out.request_id, []).extend(out.new_token_ids)
    return fed, sampled


def alone(model_dir, ids, params=PARAMS) -> list[int]:
    engine = engine_for(model_dir)
    add(engine, "r", ids, None, params)
    return run_all(engine)["r"]["tokens"]


def seq(engine: LLMEngine, rid: str) -> Sequence:
    return engine.requests[rid]


def test_a_short_request_of_another_tenant_starts_beside_a_long_prefill(lora_model_dir):
    engine = engine_for(lora_model_dir)
    add(engine, "long", prompt(200), "tenant-a")
    assert step(engine)[0] == {"long": BUDGET}
    add(engine, "short", prompt(6, start=90), "tenant-b")
    fed, sampled = step(engine)
    # the short prompt whole, the long one cut to the threshold
    assert fed == {"short": 6, "long": THRESHOLD}
    assert len(sampled["short"]) == 1  # its first token in the very next step
    assert step(engine)[0] == {"short": 1, "long": BUDGET - 1}


def test_beside_a_short_prompt_a_long_one_feeds_the_threshold(lora_model_dir):
    engine = engine_for(lora_model_dir, long_prefill_token_threshold=10)
    add(engine, "long", prompt(200), "tenant-a")
    step(engine)
    add(engine, "short", prompt(3, start=90), "tenant-b")
    assert step(engine)[0] == {"short": 3, "long": 10}
    add(engine, "medium", prompt(14, start=120), "tenant-c")  # more than the threshold
    assert step(engine)[0] == {"short": 1, "medium": 14, "long": 10}


def test_a_prompt_too_long_to_finish_in_its_share_caps_nobody(lora_model_dir):
    engine = engine_for(lora_model_dir)
    add(engine, "long", prompt(200), "tenant-a")
    step(engine)
    add(engine, "longish", prompt(BUDGET // 2 + 1, start=90), "tenant-b")
    assert step(engine)[0] == {"longish": BUDGET // 2, "long": BUDGET // 2}


def test_without_the_cap_tenants_split_the_step_equally(lora_model_dir):
    engine = engine_for(lora_model_dir, long_prefill_token_threshold=0)
    add(engine, "a", prompt(200), "tenant-a")
    step(engine)
    add(engine, "b", prompt(100, start=90), "tenant-b")
    assert step(engine)[0] == {"a": BUDGET // 2, "b": BUDGET // 2}
    add(engine, "c", prompt(5, start=150), "tenant-c")
    # c needs less than a third: the others split the rest
    fed = step(engine)[0]
    assert fed["c"] == 5 and fed["a"] + fed["b"] == BUDGET - 5 and abs(fed["a"] - fed["b"]) <= 1


def test_two_long_prompts_of_two_tenants_share_the_budget(lora_model_dir):
    engine = engine_for(lora_model_dir)
    add(engine, "a", prompt(200), "tenant-a")
    add(engine, "b", prompt(150, start=90), "tenant-b")
    # both long: the cap (the other's need) does not bite, the budget is split
    assert step(engine)[0] == {"a": BUDGET // 2, "b": BUDGET // 2}


def test_a_tenants_own_prompts_go_in_turn(lora_model_dir):
    engine = engine_for(lora_model_dir)
    add(engine, "a0", prompt(200), "tenant-a")
    step(engine)
    add(engine, "a1", prompt(6, start=90), "tenant-a")
    # never capped against its own tenant: the older prompt takes the tenant's share
    assert step(engine)[0] == {"a0": BUDGET}


def test_the_long_prompt_advances_every_step_and_finishes(lora_model_dir):
    """A short request of another tenant arrives every step: the long prefill still feeds
    at least the threshold in each, and its tokens are those it gets alone."""
    engine = engine_for(lora_model_dir)
    long_ids = prompt(300)
    add(engine, "long", long_ids, "tenant-a")
    tokens: dict[str, list[int]] = {}
    shorts = {}
    i = 0
    while "long" not in tokens:
        before = seq(engine, "long").num_computed_tokens
        left = seq(engine, "long").num_uncomputed_tokens
        rid = f"s{i}"
        shorts[rid] = prompt(3 + i % 5, start=100 + i)
        add(engine, rid, shorts[rid], f"tenant-{i % 3 + 1}")
        fed, sampled = step(engine)
        for r, t in sampled.items():
            tokens.setdefault(r, []).extend(t)
        assert fed["long"] >= min(THRESHOLD, left)
        assert sum(fed.values()) <= BUDGET
        if "long" in engine.requests:
            assert seq(engine, "long").num_computed_tokens > before
        i += 1
    assert i <= -(-len(long_ids) // THRESHOLD)
    for r, result in run_all(engine).items():
        tokens.setdefault(r, []).extend(result["tokens"])
    assert tokens["long"] == alone(lora_model_dir, long_ids)
    for rid in list(shorts)[:4]:
        assert tokens[rid] == alone(lora_model_dir, shorts[rid])


def test_outputs_equal_those_of_each_request_alone(lora_model_dir):
    engine = engine_for(lora_model_dir)
    work = [
        ("a", prompt(180), "tenant-a"),
        ("b", prompt(7, start=60), "tenant-b"),
        ("c", prompt(90, start=70), "tenant-c"),
        ("d", prompt(5, start=80), "tenant-b"),
    ]
    tokens: dict[str, list[int]] = {}
    for rid, ids, tenant in work:  # one arrival per step, beside the prefills under way
        add(engine, rid, ids, tenant)
        for r, t in step(engine)[1].items():
            tokens.setdefault(r, []).extend(t)
    for r, result in run_all(engine).items():
        tokens.setdefault(r, []).extend(result["tokens"])
    assert tokens == {rid: alone(lora_model_dir, ids) for rid, ids, _ in work}


def test_a_tenants_next_long_prompt_waits_for_a_partial_prefill_slot(lora_model_dir):
    engine = engine_for(lora_model_dir, max_num_partial_prefills=1)
    add(engine, "a", prompt(200), "tenant-a")
    step(engine)
    add(engine, "b-long", prompt(120, start=90), "tenant-b")
    add(engine, "c-short", prompt(5, start=150), "tenant-c")
    fed = step(engine)[0]
    # one prompt may be part-way: b's long one waits, c's short one finishes in its step
    assert "b-long" not in fed and fed["c-short"] == 5
    while True:
        a_left = seq(engine, "a").num_uncomputed_tokens
        fed = step(engine)[0]
        if "b-long" in fed:
            break
        assert a_left > 1
    assert fed["a"] == a_left  # b starts in the step that finishes a's prompt


def test_a_prompt_shares_the_cached_prefix_of_a_prefill_under_way(lora_model_dir):
    engine = engine_for(lora_model_dir)
    shared = prompt(64, start=30)
    add(engine, "long", shared + prompt(100, start=200), "tenant-a")
    step(engine)
    step(engine)  # 64 tokens computed: the shared part is in the cache
    add(engine, "short", shared + [7, 8], "tenant-b")
    fed, sampled = step(engine)
    assert seq(engine, "short").num_cached_tokens == 64
    assert fed["short"] == 2 and fed["long"] == max(THRESHOLD, 2)
    tokens = sampled["short"] + run_all(engine)["short"]["tokens"]
    assert tokens == alone(lora_model_dir, shared + [7, 8])


def test_a_better_class_still_goes_first(lora_model_dir):
    """Priorities come before the tenants' shares: a background prompt under way gets what
    the tenants' class leaves, at most its own budget."""
    engine = engine_for(lora_model_dir, background_tokens_per_step=8)
    add(engine, "bg", prompt(200), None, priority=Priority.BACKGROUND)
    assert step(engine)[0] == {"bg": 8}
    add(engine, "t", prompt(40, start=90), "tenant-a")
    assert step(engine)[0] == {"t": BUDGET}  # the tenant takes the whole step it needs
    fed = step(engine)[0]
    assert fed["t"] == 40 - BUDGET and fed["bg"] == 8


def test_the_settings_are_checked_and_resolved(lora_model_dir):
    engine = LLMEngine(model=lora_model_dir, kv_cache_bytes=1 << 20)
    assert engine.config.long_prefill_token_threshold == 16  # the cpu default
    assert engine.config.max_num_partial_prefills == 4
    for bad in (-1, 1.5, True, "8"):
        with pytest.raises(ConfigError, match="long_prefill_token_threshold"):
            LLMEngine(model=lora_model_dir, long_prefill_token_threshold=bad)
    for bad in (0, -2, 2.0, False, None):
        with pytest.raises(ConfigError, match="max_num_partial_prefills"):
            LLMEngine(model=lora_model_dir, max_num_partial_prefills=bad)
    context = engine.config.model_config.attention_cost_context
    assert engine.config.prefill_cost_context == context  # the cpu default: the model's
    for bad in (-1, 1.5, True, "8"):
        with pytest.raises(ConfigError, match="prefill_cost_context"):
            LLMEngine(model=lora_model_dir, prefill_cost_context=bad)


def test_by_cost_a_long_prompts_chunks_shrink_as_it_goes_and_each_step_holds(lora_model_dir):
    """Counted by position, a long prompt's chunk gets shorter the deeper it is, each step's
    cost stays within the budget, and the tokens are those counted in tokens."""
    engine = engine_for(lora_model_dir, prefill_cost_context=None, max_num_batched_tokens=64)
    pricing = engine.config.prefill_cost
    assert pricing.context == engine.config.model_config.attention_cost_context
    ids = prompt(400)
    add(engine, "long", ids, "tenant-a", SamplingParams(temperature=0, max_tokens=1))
    chunks = []
    while "long" in engine.requests and engine.requests["long"].num_uncomputed_tokens > 1:
        start = engine.requests["long"].num_computed_tokens
        fed, _ = step(engine)
        chunks.append(fed["long"])
        if sum(chunks) < len(ids):  # a whole chunk: the most its cost allows
            assert pricing.of(start, fed["long"]) <= 64 < pricing.of(start, fed["long"] + 1)
    assert chunks[0] == pricing.tokens_within(0, 64) and chunks[-2] < chunks[0]
    assert sorted(chunks[:-1], reverse=True) == chunks[:-1]
    by_tokens = engine_for(lora_model_dir, max_num_batched_tokens=64)
    add(by_tokens, "long", ids, "tenant-a", SamplingParams(temperature=0, max_tokens=4))
    add(engine, "again", ids, "tenant-a", SamplingParams(temperature=0, max_tokens=4))
    assert run_all(engine)["again"]["tokens"] == run_all(by_tokens)["long"]["tokens"]


def test_by_cost_a_short_request_beside_a_deep_prompt_gets_the_floor_in_cost(lora_model_dir):
    engine = engine_for(lora_model_dir, prefill_cost_context=None, max_num_batched_tokens=64)
    pricing = engine.config.prefill_cost
    add(engine, "long", prompt(400), "tenant-a")
    while engine.requests["long"].num_computed_tokens < 200:
        step(engine)
    start = engine.requests["long"].num_computed_tokens
    add(engine, "short", prompt(3, start=90), "tenant-b")
    fed, sampled = step(engine)
    assert fed["short"] == 3 and len(sampled["short"]) == 1
    # beside it the long prompt feeds the floor's worth of cost, fewer tokens than the floor
    assert fed["long"] == pricing.tokens_within(start, THRESHOLD) < THRESHOLD
