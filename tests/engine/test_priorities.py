"""Priorities: the platform's background work (scoring, warm-up) runs behind tenants'
traffic and delays it by at most the step under way; within a class, fairness holds."""

from inference.engine import EngineRequest, LLMEngine, Priority, SamplingParams
from tests.engine.lora_fixtures import lora_engine, run_all

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
LONG_PROMPT = [20 + i % 300 for i in range(120)]


def add(engine, rid, ids, priority=0, params=GREEDY):
    engine.add_request(
        EngineRequest(rid, prompt_token_ids=ids, sampling_params=params, priority=priority)
    )


def alone(model_dir, ids, params=GREEDY) -> list[int]:
    engine = lora_engine(model_dir)
    add(engine, "x", ids, params=params)
    return run_all(engine)["x"]["tokens"]


def test_a_tenant_request_goes_ahead_of_a_background_prefill(lora_model_dir):
    engine = lora_engine(
        lora_model_dir, max_num_batched_tokens=16, max_num_seqs=4, prefill_cost_context=0
    )
    add(engine, "background", LONG_PROMPT, priority=Priority.BACKGROUND)
    engine.step()  # the background prompt's first chunk
    add(engine, "tenant", [7, 8, 9, 10, 11])
    computed = engine.requests["background"].num_computed_tokens
    outputs = engine.step()
    assert [o.request_id for o in outputs] == ["tenant"]  # its whole prompt, first token out
    # the background prompt got only what the budget had left
    assert engine.requests["background"].num_computed_tokens == computed + 16 - 5
    results = run_all(engine)
    assert outputs[0].new_token_ids + results["tenant"]["tokens"] == alone(
        lora_model_dir, [7, 8, 9, 10, 11]
    )
    assert results["background"]["tokens"] == alone(lora_model_dir, LONG_PROMPT)


def test_a_tenant_request_preempts_background_work_for_a_sequence_slot(lora_model_dir):
    engine = lora_engine(lora_model_dir, max_num_seqs=1)
    long = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    add(engine, "background", [5, 6, 7], priority=Priority.BACKGROUND, params=long)
    background = [t for _ in range(3) for o in engine.step() for t in o.new_token_ids]
    add(engine, "tenant", [7, 8, 9])
    outputs = engine.step()
    assert [o.request_id for o in outputs] == ["tenant"]
    assert engine.scheduler.num_preemptions == 1
    results = run_all(engine)
    assert outputs[0].new_token_ids + results["tenant"]["tokens"] == alone(
        lora_model_dir, [7, 8, 9]
    )
    # recomputed after the tenant finished, it continues exactly where it was
    background += results["background"]["tokens"]
    assert background == alone(lora_model_dir, [5, 6, 7], params=long)


def test_a_tenant_request_preempts_background_work_for_kv_blocks(lora_model_dir):
    probe = lora_engine(lora_model_dir)
    block_bytes = probe.config.kv_block_bytes
    # base-model requests only: no LoRA slots share the 40 blocks
    engine = LLMEngine(model=lora_model_dir, kv_cache_bytes=40 * block_bytes, block_size=4)
    assert engine.block_manager.num_blocks == 40
    add(engine, "background", LONG_PROMPT, priority=Priority.BACKGROUND)  # 31 blocks
    while not (outputs := engine.step()):  # its prompt, in background-sized chunks
        pass
    [first] = outputs
    add(engine, "tenant", LONG_PROMPT[:60][::-1])  # 15 blocks: more than are free
    outputs = engine.step()
    assert [o.request_id for o in outputs] == ["tenant"]
    assert engine.requests["background"].num_preemptions == 1
    results = run_all(engine)
    background = first.new_token_ids + results["background"]["tokens"]
    assert background == alone(lora_model_dir, LONG_PROMPT)


def test_background_requests_never_preempt_tenants(lora_model_dir):
    engine = lora_engine(lora_model_dir, max_num_seqs=1)
    add(engine, "tenant", [5, 6, 7])
    engine.step()
    add(engine, "background", [7, 8, 9], priority=Priority.BACKGROUND)
    for _ in range(GREEDY.max_tokens - 1):
        assert {o.request_id for o in engine.step()} == {"tenant"}
    assert engine.scheduler.num_preemptions == 0
    assert run_all(engine)["background"]["finish"] == "length"


def test_a_bad_priority_is_refused(lora_model_dir):
    import pytest

    from inference.engine import InvalidRequestError

    engine = LLMEngine(model=lora_model_dir, kv_cache_bytes=1 << 20)
    for bad in ("high", 1.5, True, None):
        with pytest.raises(InvalidRequestError, match="priority"):
            add(engine, "r", [5], priority=bad)
    assert engine.requests == {}
