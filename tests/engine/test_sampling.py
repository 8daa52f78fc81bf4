"""Sampling, stopping and logprobs, end to end through the engine."""

import json
from typing import cast

import pytest
import torch
from transformers import AutoModelForCausalLM

from inference.engine import EngineRequest, LLMEngine, SamplingParams
from inference.engine.sampler import Sampler
from inference.engine.sequence import Sequence
from inference.engine.tokenizer import IncrementalDetokenizer
from tests.tiny_llama import make_tiny_llama

PROMPT = "The quick brown fox"
OTHERS = ["Paris is the capital", "Numbers 0 1 2", "Many tenants share one base model"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def engine(model_dir):
    return LLMEngine(model=model_dir, kv_cache_bytes=1 << 20)


def greedy(engine, prompt=PROMPT, **kw):
    params = SamplingParams(
        temperature=0, max_tokens=kw.pop("max_tokens", 16), ignore_eos=True, **kw
    )
    return engine.generate([prompt], params)[0]


def test_same_seed_same_tokens_whatever_the_batch(engine):
    seeded = SamplingParams(
        temperature=0.9, top_p=0.95, top_k=50, seed=1234, max_tokens=16, ignore_eos=True
    )
    alone = engine.generate([PROMPT], seeded)[0].token_ids
    noisy = [SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True) for _ in OTHERS]
    batched = engine.generate([*OTHERS, PROMPT], [*noisy, seeded])[-1].token_ids
    assert batched == alone
    other_seed = SamplingParams(
        temperature=0.9, top_p=0.95, top_k=50, seed=99, max_tokens=16, ignore_eos=True
    )
    assert engine.generate([PROMPT], other_seed)[0].token_ids != alone


def test_unseeded_requests_draw_from_the_engine_seed(model_dir):
    """Without a seed each request gets its own from the engine's seed, in arrival order:
    two requests differ, and a fresh engine repeats them."""
    params = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)

    def run() -> list[list[int]]:
        fresh = LLMEngine(model=model_dir, kv_cache_bytes=1 << 20)
        return [out.token_ids for out in fresh.generate([PROMPT, PROMPT], params)]

    first = run()
    assert first[0] != first[1]
    assert run() == first


def test_top_k_one_equals_greedy(engine):
    top1 = SamplingParams(temperature=1.0, top_k=1, max_tokens=16, ignore_eos=True)
    assert engine.generate([PROMPT], top1)[0].token_ids == greedy(engine).token_ids


def test_max_tokens_ends_with_length(engine):
    out = greedy(engine, max_tokens=5)
    assert len(out.token_ids) == 5 and out.finish_reason == "length"


def test_stop_string_ends_with_stop_and_is_not_returned(engine):
    full = greedy(engine, max_tokens=24)
    stop = full.text[len(full.text) // 2 :][:3]
    cut = full.text.find(stop)
    assert len(stop) == 3 and cut > 0
    out = greedy(engine, max_tokens=24, stop=["never appears", stop])
    assert out.finish_reason == "stop"
    assert out.text == full.text[:cut]


def test_streamed_text_never_shows_a_stop_string_in_the_making(engine):
    full = greedy(engine, max_tokens=24)
    stop = full.text[len(full.text) // 2 :][:5]
    cut = full.text.find(stop)
    assert len(stop) == 5 and cut > 0
    engine.add_request(
        EngineRequest(
            "s", PROMPT, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop=[stop])
        )
    )
    pieces = []
    while engine.has_unfinished():
        for out in engine.step():
            pieces.append(out.new_text)
            assert stop not in "".join(pieces)
    assert "".join(pieces) == full.text[:cut]


def test_stop_token_id_ends_with_stop(engine):
    full = greedy(engine)
    stop_id = full.token_ids[3]
    first = full.token_ids.index(stop_id)
    out = greedy(engine, stop_token_ids=[stop_id])
    assert out.finish_reason == "stop"
    assert out.token_ids == full.token_ids[: first + 1]  # the stop token is reported, not printed
    assert out.text == engine.tokenizer.decode(full.token_ids[:first])


def test_model_eos_stops_unless_ignored(model_dir, tmp_path):
    reference = LLMEngine(model=model_dir, kv_cache_bytes=1 << 20)
    full = greedy(reference)
    eos = full.token_ids[4]
    config = json.loads((model_dir / "config.json").read_text())
    folder = tmp_path / "eos"
    folder.mkdir()
    for f in model_dir.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    (folder / "config.json").write_text(json.dumps({**config, "eos_token_id": [2, eos]}))
    engine = LLMEngine(model=folder, kv_cache_bytes=1 << 20)
    stopped = engine.generate([PROMPT], SamplingParams(temperature=0, max_tokens=16))[0]
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == full.token_ids[: full.token_ids.index(eos) + 1]
    assert greedy(engine).token_ids == full.token_ids


def test_logprobs_agree_with_log_softmax_of_the_logits(model_dir, engine):
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    prompt_ids = engine.tokenizer.encode(PROMPT)
    params = SamplingParams(temperature=0.8, seed=3, max_tokens=6, ignore_eos=True, logprobs=5)
    out = engine.generate([prompt_ids], params)[0]
    assert len(out.logprobs) == 6
    ids = list(prompt_ids)
    for token_id, lp in zip(out.token_ids, out.logprobs, strict=True):
        with torch.no_grad():
            expected = hf(torch.tensor([ids])).logits[0, -1].log_softmax(-1)
        assert lp.token_id == token_id
        assert lp.logprob == pytest.approx(expected[token_id].item(), abs=1e-4)
        values, top_ids = expected.topk(5)
        assert [t for t, _ in lp.top] == top_ids.tolist()
        assert [v for _, v in lp.top] == pytest.approx(values.tolist(), abs=1e-4)
        ids.append(token_id)


def test_logprobs_zero_gives_only_the_chosen_token(engine):
    out = greedy(engine, max_tokens=3, logprobs=0)
    assert [lp.top for lp in out.logprobs] == [[], [], []]
    assert all(lp.logprob <= 0 for lp in out.logprobs)
    assert greedy(engine, max_tokens=3).logprobs == []


def _draws(logits: list[float], n: int, **params) -> torch.Tensor:
    """n tokens sampled from fixed logits, one sequence per row."""
    p = SamplingParams(**params)
    no_text = cast(IncrementalDetokenizer, None)  # the sampler never detokenizes
    seqs = [Sequence(str(i), [0], p, seed=i, detokenizer=no_text) for i in range(n)]
    return torch.tensor(Sampler()(torch.tensor([logits] * n), seqs).token_ids)


def test_sampling_follows_the_softmax():
    probs = torch.tensor([0.4, 0.3, 0.2, 0.1])
    draws = _draws(probs.log().tolist(), 4000, temperature=1.0)
    freq = torch.bincount(draws, minlength=4) / 4000
    assert torch.allclose(freq, probs, atol=0.03)


def test_top_k_and_top_p_cut_the_tail():
    logits = torch.tensor([0.4, 0.3, 0.2, 0.1]).log().tolist()
    assert set(_draws(logits, 500, top_k=2).tolist()) == {0, 1}
    # top_p 0.5: 0.4 alone falls short, so 0.3 joins; 0.2 comes after 0.7 is reached
    assert set(_draws(logits, 500, top_p=0.5).tolist()) == {0, 1}
    assert set(_draws(logits, 500, top_p=0.3).tolist()) == {0}
    assert set(_draws(logits, 500, top_k=3, top_p=0.99).tolist()) == {0, 1, 2}


def test_low_temperature_sharpens():
    logits = torch.tensor([0.4, 0.3, 0.2, 0.1]).log().tolist()
    freq0 = (_draws(logits, 1000, temperature=0.1) == 0).float().mean()
    assert freq0 > 0.9
