"""Chunked prefill: a long prompt is fed over several steps within the token budget while
running sequences keep decoding, and the tokens are those of an unchunked prefill."""

import pytest

from inference.engine import ConfigError, EngineRequest, LLMEngine, SamplingParams
from tests.engine.lora_fixtures import lora_engine, request_for, run_all

BUDGET = 16
PARAMS = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def requests(adapters):
    return {n: request_for(n, adapters(n, rank=8, alpha=16)) for n in ("cp0", "cp1")}


def chunked(model_dir, **kwargs) -> LLMEngine:
    """Chunks counted in tokens (as on cuda): their cost by position has tests of its own."""
    kwargs.setdefault("prefill_cost_context", 0)
    return lora_engine(model_dir, max_num_batched_tokens=BUDGET, max_num_seqs=4, **kwargs)


def unchunked(model_dir) -> LLMEngine:
    return lora_engine(model_dir, enable_chunked_prefill=False, enable_prefix_caching=False)


def prompt(n: int, start: int = 20) -> list[int]:
    return [start + i % 300 for i in range(n)]


def add(engine, rid, ids, lora=None, params=PARAMS):
    engine.add_request(
        EngineRequest(rid, prompt_token_ids=ids, sampling_params=params, lora_request=lora)
    )


def run_mixed(engine, work) -> dict[str, list[int]]:
    """Requests arrive one per step (so prefill chunks share steps with decodes)."""
    tokens: dict[str, list[int]] = {}
    for rid, ids, lora in work:
        add(engine, rid, ids, lora)
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    for rid, r in run_all(engine).items():
        tokens.setdefault(rid, []).extend(r["tokens"])
    return tokens


@pytest.mark.parametrize("length", [1, 15, 16, 17, 40, 70])
def test_one_prompt_chunked_equals_unchunked(lora_model_dir, length):
    ids = prompt(length)
    engine = chunked(lora_model_dir)
    add(engine, "r", ids)
    steps_before = engine.num_steps
    result = run_all(engine)["r"]["tokens"]
    # ceil(length / budget) prefill steps, then one per further token
    assert engine.num_steps - steps_before == -(-length // BUDGET) + PARAMS.max_tokens - 1
    reference = unchunked(lora_model_dir)
    add(reference, "r", ids)
    assert result == run_all(reference)["r"]["tokens"]


def test_chunks_mixed_with_decodes_and_adapters_equal_unchunked(lora_model_dir, requests):
    work = [
        (f"r{i}", prompt(n, start=30 + 7 * i), requests.get(name))
        for i, (n, name) in enumerate(
            [(5, None), (40, "cp0"), (3, "cp1"), (70, None), (17, "cp1"), (33, "cp0"), (2, None)]
        )
    ]
    expected = run_mixed(unchunked(lora_model_dir), work)
    assert run_mixed(chunked(lora_model_dir), work) == expected
    assert run_mixed(chunked(lora_model_dir, enable_prefix_caching=False), work) == expected


def test_running_streams_keep_decoding_while_a_long_prompt_is_prefilled(lora_model_dir):
    engine = chunked(lora_model_dir)
    long_params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    for i in range(3):
        add(engine, f"s{i}", prompt(4, start=50 + i), params=long_params)
    engine.step()
    engine.step()
    add(engine, "long", prompt(100))
    steps = []
    while not engine.requests["long"].num_computed_tokens >= 100:
        steps.append({o.request_id for o in engine.step()})
    assert len(steps) >= 100 // (BUDGET - 3)  # the prompt took several steps...
    assert all(step >= {"s0", "s1", "s2"} for step in steps)  # ...each with every stream


def test_without_chunking_a_long_prompt_stalls_the_streams_for_one_step(lora_model_dir):
    """The baseline the benchmark compares against: the whole prompt in one step."""
    engine = lora_engine(lora_model_dir, enable_chunked_prefill=False)
    add(engine, "s", prompt(4), params=SamplingParams(temperature=0, max_tokens=20))
    engine.step()
    add(engine, "long", prompt(100))
    engine.step()
    assert engine.requests["long"].num_computed_tokens == 100


def test_budget_settings_are_checked(lora_model_dir):
    with pytest.raises(ConfigError, match="at least max_num_seqs"):
        LLMEngine(model=lora_model_dir, max_num_batched_tokens=8, max_num_seqs=16)
    with pytest.raises(ConfigError, match="without chunked prefill"):
        LLMEngine(
            model=lora_model_dir,
            max_model_len=64,
            max_num_batched_tokens=32,
            enable_chunked_prefill=False,
        )
    with pytest.raises(ConfigError, match="positive integer"):
        LLMEngine(model=lora_model_dir, max_num_batched_tokens=0)
    engine = LLMEngine(model=lora_model_dir, kv_cache_bytes=1 << 20)
    assert engine.config.max_num_batched_tokens == 128  # the chunked default on CPU
