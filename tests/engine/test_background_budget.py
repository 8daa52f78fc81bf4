"""Background work's budget: background work (the quality gate's scoring) feeds at most
`background_tokens_per_step` tokens a step and never joins a step of tenants' decodes
alone, so a tenant's request is in every step until it finishes; 0 turns the budget off;
background work is preempted before tenants; its scores are the same either way."""

import pytest

from inference.engine import ConfigError, EngineRequest, LLMEngine, Priority, SamplingParams
from inference.engine.scoring import score_request, score_result
from tests.engine.lora_fixtures import lora_engine, run_all

BUDGET = 32
TENANT = [7, 8, 9, 10, 11]
TENANT_PARAMS = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)


def row(i: int) -> tuple[list[int], list[int]]:
    """An eval row: 20 prompt tokens and 10 completion tokens, different for each i."""
    return [3 + (i * 37 + j) % 300 for j in range(20)], [5 + (i + j) % 200 for j in range(10)]


def engine_for(model_dir, **kwargs) -> LLMEngine:
    kwargs.setdefault("max_num_batched_tokens", BUDGET)
    kwargs.setdefault("prefill_cost_context", 0)  # in tokens: the cost has tests of its own
    return lora_engine(model_dir, max_num_seqs=8, **kwargs)


def add_scoring(engine: LLMEngine, n: int) -> None:
    for i in range(n):
        engine.add_request(score_request(f"score-{i}", *row(i)))


def add_tenant(engine: LLMEngine, rid: str = "tenant", params=TENANT_PARAMS, ids=TENANT) -> None:
    engine.add_request(EngineRequest(rid, prompt_token_ids=ids, sampling_params=params))


def record_batches(engine: LLMEngine) -> list[dict[str, int]]:
    """Every batch the scheduler hands out from now on, as {request id: tokens fed}."""
    batches: list[dict[str, int]] = []
    schedule = engine.scheduler.schedule

    def recorded():
        batch = schedule()
        if batch:
            batches.append({seq.request_id: n for seq, n in batch.entries()})
        return batch

    engine.scheduler.schedule = recorded  # type: ignore[method-assign]
    return batches


def background_tokens(batch: dict[str, int]) -> int:
    return sum(n for rid, n in batch.items() if rid.startswith("score-"))


def run_scoring(engine: LLMEngine, n: int) -> tuple[dict[str, list[float]], list[int]]:
    """One step of background work alone, then the tenant's request arrives; step until
    idle: each scoring request's completion logprobs, and the tenant's tokens."""
    scores: dict[str, list[float]] = {}
    tenant: list[int] = []
    steps = 0
    while engine.has_unfinished():
        for out in engine.step():
            if out.request_id.startswith("score-") and out.prompt_logprobs is not None:
                result = score_result(out.prompt_logprobs, len(row(0)[0]))
                scores[out.request_id] = result.token_logprobs
            elif out.request_id == "tenant":
                tenant += out.new_token_ids
        steps += 1
        if steps == 1:
            add_tenant(engine)
    assert len(scores) == n
    return scores, tenant


def test_background_feeds_its_budget_and_never_joins_a_tenants_decodes(lora_model_dir):
    engine = engine_for(lora_model_dir, background_tokens_per_step=6)
    add_scoring(engine, 12)
    batches = record_batches(engine)
    scores, tenant = run_scoring(engine, 12)  # one step alone, then the tenant's too
    assert len(tenant) == TENANT_PARAMS.max_tokens
    alone, beside, after = batches[0], batches[1:11], batches[11:]
    assert background_tokens(alone) == 6  # alone too: a tenant arriving waits for it
    # the tenant is in every step from its arrival until it finishes (its prompt, then one
    # token a step); background work rides along with its prompt only
    assert [b.get("tenant") for b in beside] == [len(TENANT)] + [1] * 9
    assert [background_tokens(b) for b in beside] == [6] + [0] * 9
    assert all("tenant" not in b for b in after)
    assert [background_tokens(b) for b in after] == [6] * (12 * 30 // 6 - 2)


def test_a_zero_budget_lets_background_fill_what_tenants_leave(lora_model_dir):
    engine = engine_for(lora_model_dir, background_tokens_per_step=0)
    add_scoring(engine, 12)
    batches = record_batches(engine)
    run_scoring(engine, 12)
    assert background_tokens(batches[0]) == BUDGET
    beside = batches[1:11]
    assert [b.get("tenant") for b in beside] == [len(TENANT)] + [1] * 9
    assert [background_tokens(b) for b in beside] == [BUDGET - len(TENANT)] + [BUDGET - 1] * 9


def test_scores_are_the_same_with_and_without_the_budget(lora_model_dir):
    """The same tokens are scored; chunked at other places, the logprobs are the same up
    to float32 rounding (as they are whatever else shares a step)."""
    budgeted = engine_for(lora_model_dir, background_tokens_per_step=5)
    add_scoring(budgeted, 10)
    with_budget, tenant = run_scoring(budgeted, 10)
    unbudgeted = engine_for(lora_model_dir, background_tokens_per_step=0)
    add_scoring(unbudgeted, 10)
    without_budget, tenant_before = run_scoring(unbudgeted, 10)
    assert with_budget.keys() == without_budget.keys()
    for rid, logprobs in with_budget.items():
        assert logprobs == pytest.approx(without_budget[rid], rel=1e-5, abs=1e-5)
    assert tenant == tenant_before


def test_a_tenant_decode_that_needs_a_block_preempts_background_work_first(lora_model_dir):
    """The background sequence is the oldest running one: newest-first alone would preempt
    the second tenant; the worst class goes first."""
    probe = lora_engine(lora_model_dir)
    engine = LLMEngine(  # base-model requests only: no LoRA slots share the 12 blocks
        model=lora_model_dir,
        block_size=4,
        kv_cache_bytes=12 * probe.config.kv_block_bytes,
        background_tokens_per_step=4,
    )
    assert engine.block_manager.num_blocks == 12 and engine.block_manager.block_size == 4
    long = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    engine.add_request(
        EngineRequest(
            "background",
            prompt_token_ids=list(range(30, 46)),
            sampling_params=long,
            priority=Priority.BACKGROUND,
        )
    )
    background: list[int] = []
    while engine.requests["background"].num_computed_tokens < 17:  # 4 tokens a step
        background += [t for out in engine.step() for t in out.new_token_ids]
    assert engine.block_manager.num_free_blocks == 7  # 16 prompt tokens + 1: five blocks
    # three blocks each (11 prompt tokens), a fourth for their 13th token: one is free
    for rid, start in (("t1", 60), ("t2", 100)):
        add_tenant(engine, rid, TENANT_PARAMS, list(range(start, start + 11)))
    seqs = dict(engine.requests)
    results = run_all(engine)
    assert {rid: seq.num_preemptions for rid, seq in seqs.items()} == {
        "background": 1,
        "t1": 0,
        "t2": 0,
    }
    assert all(r["finish"] == "length" for r in results.values())
    alone = lora_engine(lora_model_dir)
    alone.add_request(
        EngineRequest("x", prompt_token_ids=list(range(30, 46)), sampling_params=long)
    )
    assert background + results["background"]["tokens"] == run_all(alone)["x"]["tokens"]


def test_without_chunked_prefill_a_longer_background_prompt_waits_for_the_tenant(
    lora_model_dir,
):
    engine = lora_engine(
        lora_model_dir,
        enable_chunked_prefill=False,
        max_model_len=64,
        max_num_batched_tokens=64,
        background_tokens_per_step=16,
    )
    add_tenant(engine)
    engine.add_request(score_request("score-short", list(range(20, 30)), [40, 41]))
    engine.add_request(score_request("score-long", list(range(20, 40)), [40, 41]))
    batches = record_batches(engine)
    run_all(engine)
    assert batches[0] == {"tenant": len(TENANT), "score-short": 12}  # 12 <= 16 rides along
    first_long = next(i for i, b in enumerate(batches) if "score-long" in b)
    assert all("tenant" in b for b in batches[:first_long])
    assert "tenant" not in batches[first_long]  # 22 > 16: only once the tenant is gone


def test_the_background_budget_is_checked_and_resolved(lora_model_dir):
    engine = LLMEngine(model=lora_model_dir, kv_cache_bytes=1 << 20)
    assert engine.config.background_tokens_per_step == 32  # the CPU default
    capped = LLMEngine(
        model=lora_model_dir,
        kv_cache_bytes=1 << 20,
        max_num_batched_tokens=64,
        max_num_seqs=8,
        background_tokens_per_step=1000,
    )
    assert capped.config.background_tokens_per_step == 64  # no more than a step holds
    for bad in (-1, True, 2.5, "8"):
        with pytest.raises(ConfigError, match="background_tokens_per_step"):
            LLMEngine(model=lora_model_dir, background_tokens_per_step=bad)
