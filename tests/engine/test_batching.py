"""Continuous batching and the paged KV cache: batching never changes greedy output."""

import pytest

from inference.engine import EngineConfig, EngineRequest, LLMEngine, SamplingParams
from tests.tiny_llama import make_tiny_llama

BLOCK = 4
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
PROMPTS = [
    "The quick brown fox",
    "Paris",
    "A language model predicts the next token from the tokens before it.",
    "Many tenants share one base model",
    "Numbers 0 1 2 3",
    "Héllo wörld 🙂",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("tiny"))


def make_engine(model_dir, num_blocks=256, **kwargs) -> LLMEngine:
    block_bytes = EngineConfig(model=model_dir, block_size=BLOCK).kv_block_bytes
    return LLMEngine(
        model=model_dir, block_size=BLOCK, kv_cache_bytes=num_blocks * block_bytes, **kwargs
    )


@pytest.fixture(scope="module")
def alone(model_dir):
    """Each prompt's greedy tokens, decoded with nothing else in the engine."""
    engine = make_engine(model_dir)
    return {p: engine.generate([p], GREEDY)[0].token_ids for p in PROMPTS}


def run_all(engine: LLMEngine) -> dict[str, list[int]]:
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    return tokens


def test_batched_greedy_equals_each_alone(model_dir, alone):
    engine = make_engine(model_dir)
    outs = engine.generate(PROMPTS, GREEDY)
    assert {p: o.token_ids for p, o in zip(PROMPTS, outs, strict=True)} == alone
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_requests_joining_mid_flight_get_the_same_tokens(model_dir, alone):
    engine = make_engine(model_dir)
    for p in PROMPTS[:2]:
        engine.add_request(EngineRequest(p, p, GREEDY))
    tokens: dict[str, list[int]] = {}
    for late in PROMPTS[2:]:
        for _ in range(3):  # a few decode steps, then another request arrives
            for out in engine.step():
                tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
        engine.add_request(EngineRequest(late, late, GREEDY))
        assert len(engine.scheduler.running) >= 2
    for rid, toks in run_all(engine).items():
        tokens.setdefault(rid, []).extend(toks)
    assert tokens == alone


def test_preemption_by_kv_budget_keeps_outputs_identical(model_dir, alone):
    # 10 blocks of 4 tokens: about two sequences at a time, so decodes must preempt.
    engine = make_engine(model_dir, num_blocks=10)
    outs = engine.generate(PROMPTS, GREEDY)
    assert {p: o.token_ids for p, o in zip(PROMPTS, outs, strict=True)} == alone
    assert engine.metrics.preemptions > 0
    assert engine.block_manager.num_free_blocks == 10


def test_ten_requests_finish_with_a_budget_for_two(model_dir, alone):
    prompts = [PROMPTS[i % 2] for i in range(10)]
    engine = make_engine(model_dir)
    longest = max(len(engine.tokenizer.encode(p)) for p in prompts) + GREEDY.max_tokens
    engine = make_engine(model_dir, num_blocks=2 * -(-longest // BLOCK))
    for i, p in enumerate(prompts):
        engine.add_request(EngineRequest(str(i), p, GREEDY))
    tokens: dict[str, list[int]] = {}
    finish = {}
    while engine.has_unfinished():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            finish[out.request_id] = out.finish_reason
    assert [tokens[str(i)] for i in range(10)] == [alone[p] for p in prompts]
    assert set(finish.values()) == {"length"}
    assert engine.stats()["finished"]["length"] == 10
    assert engine.metrics.preemptions > 0  # admitted by prompt size, squeezed while decoding


def test_max_num_seqs_caps_the_running_batch(model_dir, alone):
    engine = make_engine(model_dir, max_num_seqs=2)
    for p in PROMPTS:
        engine.add_request(EngineRequest(p, p, GREEDY))
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
        assert len(engine.scheduler.running) <= 2
    assert tokens == alone


def test_max_num_batched_tokens_splits_prefills(model_dir, alone):
    engine = make_engine(model_dir, max_model_len=40, max_num_batched_tokens=40, max_num_seqs=8)
    lengths = {}
    for p in PROMPTS:
        engine.add_request(EngineRequest(p, p, GREEDY))
        lengths[p] = len(engine.requests[p])
    assert sum(lengths.values()) > 40
    first = engine.step()
    assert 0 < len(first) < len(PROMPTS)
    assert sum(lengths[o.request_id] for o in first) <= 40
    tokens = {o.request_id: o.new_token_ids for o in first}
    for rid, toks in run_all(engine).items():
        tokens.setdefault(rid, []).extend(toks)
    assert tokens == alone


def test_abort_frees_blocks_at_once_and_reports_abort(model_dir):
    engine = make_engine(model_dir)
    engine.add_request(EngineRequest("a", PROMPTS[2], GREEDY))
    engine.add_request(EngineRequest("b", PROMPTS[0], GREEDY))
    engine.step()
    engine.step()
    used = engine.block_manager.num_used_blocks
    assert engine.abort("a") is True
    assert engine.block_manager.num_used_blocks < used
    outs = engine.step()
    assert any(o.request_id == "a" and o.finished and o.finish_reason == "abort" for o in outs)
    assert all(o.request_id == "b" for o in engine.step())
    assert engine.abort("a") is False  # already gone
    assert engine.stats()["finished"]["abort"] == 1


def test_a_sequence_stops_at_the_cache_size_when_alone(model_dir):
    engine = make_engine(model_dir, num_blocks=4)  # 16 tokens in all
    [out] = engine.generate(
        ["Paris"], SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
    )
    assert out.finish_reason == "length"
    assert len(out.prompt_token_ids) + len(out.token_ids) == 16
