"""Penalties, logit_bias, min_tokens and the stop options end to end through the engine on
the tiny model: greedy generation equals transformers' `generate` with the same processors,
and the text follows skip_special_tokens and include_stop_str_in_output."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from inference.engine import EngineConfig, InvalidRequestError, LLMEngine, SamplingParams
from tests.tiny_llama import make_tiny_llama

PROMPT = "The quick brown fox"
SPECIAL = 1  # the tiny tokenizer's <|im_start|>: a special token


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def engine(model_dir):
    return LLMEngine(model=model_dir, kv_cache_bytes=1 << 20)


@pytest.fixture(scope="module")
def hf(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def greedy(engine, prompt=PROMPT, **kw):
    kw = {"temperature": 0, "max_tokens": 16, "ignore_eos": True, **kw}
    return engine.generate([prompt], SamplingParams(**kw))[0]


def hf_greedy(hf, prompt_ids, **kw):
    kw = {"max_new_tokens": 16, "do_sample": False, "eos_token_id": None, "pad_token_id": 0, **kw}
    out = hf.generate(torch.tensor([prompt_ids]), **kw)
    return out[0, len(prompt_ids) :].tolist()


@pytest.mark.parametrize("penalty", [0.7, 1.5])
def test_repetition_penalty_generates_what_transformers_generates(engine, hf, penalty):
    prompt = engine.tokenizer.encode(PROMPT)
    out = greedy(engine, prompt, max_tokens=24, repetition_penalty=penalty)
    assert out.token_ids == hf_greedy(hf, prompt, max_new_tokens=24, repetition_penalty=penalty)
    assert out.token_ids != greedy(engine, prompt, max_tokens=24).token_ids


def test_logit_bias_generates_what_sequence_bias_generates(engine, hf):
    prompt = engine.tokenizer.encode(PROMPT)
    plain = greedy(engine, prompt).token_ids
    bias = {plain[0]: -5.0, plain[2]: -3.0, 77: 1.5}
    out = greedy(engine, prompt, logit_bias=bias)
    sequence_bias = [[[t], b] for t, b in bias.items()]
    assert out.token_ids == hf_greedy(hf, prompt, sequence_bias=sequence_bias)
    assert greedy(engine, prompt, logit_bias={123: 100}).token_ids == [123] * 16


def test_min_tokens_holds_the_end_back_as_min_new_tokens_does(model_dir, hf, tmp_path):
    """A copy of the model whose end token is one greedy decoding picks early."""
    reference = LLMEngine(model=model_dir, kv_cache_bytes=1 << 20)
    full = greedy(reference, max_tokens=24)
    eos = full.token_ids[2]
    folder = tmp_path / "eos"
    folder.mkdir()
    for f in model_dir.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    config = json.loads((model_dir / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "eos_token_id": [2, eos]}))
    engine = LLMEngine(model=folder, kv_cache_bytes=1 << 20)
    prompt = engine.tokenizer.encode(PROMPT)
    early = greedy(engine, prompt, max_tokens=24, ignore_eos=False)
    assert early.finish_reason == "stop" and len(early.token_ids) <= 3
    held = greedy(engine, prompt, max_tokens=24, ignore_eos=False, min_tokens=10)
    assert eos not in held.token_ids[:10]
    expected = hf_greedy(hf, prompt, max_new_tokens=24, min_new_tokens=10, eos_token_id=[2, eos])
    assert held.token_ids == expected[: len(held.token_ids)]
    assert held.finish_reason == "stop" or len(held.token_ids) == 24


def test_stop_token_ids_are_held_by_min_tokens_too(engine):
    full = greedy(engine)
    stop_id = full.token_ids[1]
    out = greedy(engine, stop_token_ids=[stop_id], min_tokens=5)
    assert stop_id not in out.token_ids[:5]


def test_include_stop_str_in_output_keeps_the_stop_string(engine):
    full = greedy(engine, max_tokens=24)
    stop = full.text[len(full.text) // 2 :][:3]
    cut = full.text.find(stop)
    kept = greedy(engine, max_tokens=24, stop=[stop], include_stop_str_in_output=True)
    assert kept.finish_reason == "stop" and kept.text == full.text[: cut + len(stop)]
    dropped = greedy(engine, max_tokens=24, stop=[stop])
    assert dropped.text == full.text[:cut]


def test_include_stop_str_in_output_keeps_a_stop_tokens_text(engine):
    full = greedy(engine)
    stop_id = full.token_ids[3]
    first = full.token_ids.index(stop_id)
    out = greedy(engine, stop_token_ids=[stop_id], include_stop_str_in_output=True)
    assert out.text == engine.tokenizer.decode(full.token_ids[: first + 1])


def test_stop_strings_wait_for_min_tokens(engine):
    full = greedy(engine, max_tokens=24)
    first_piece = engine.tokenizer.decode(full.token_ids[:1])
    assert first_piece.strip()
    early = greedy(engine, max_tokens=24, stop=[first_piece.strip()])
    assert early.finish_reason == "stop" and len(early.token_ids) == 1
    waited = greedy(engine, max_tokens=24, stop=[first_piece.strip()], min_tokens=4)
    assert len(waited.token_ids) > 4


def test_skip_special_tokens_false_shows_special_tokens(engine):
    forced = {"logit_bias": {SPECIAL: 100}, "max_tokens": 3}
    assert greedy(engine, **forced).text == ""
    shown = greedy(engine, **forced, skip_special_tokens=False).text
    assert shown == "<|im_start|>" * 3


def test_token_ids_outside_the_vocabulary_are_refused(engine):
    vocab = engine.config.model_config.vocab_size
    for params in ({"logit_bias": {vocab: 1.0}}, {"stop_token_ids": [vocab]}):
        with pytest.raises(InvalidRequestError, match=str(vocab)):
            greedy(engine, **params)


@pytest.mark.parametrize(
    "params",
    [
        {"presence_penalty": 2.5},
        {"frequency_penalty": -3},
        {"repetition_penalty": 0},
        {"repetition_penalty": float("inf")},
        {"min_p": 1.5},
        {"min_tokens": 17},  # above max_tokens
        {"min_tokens": -1},
        {"logit_bias": {5: 101}},
        {"logit_bias": {-1: 1}},
        {"logit_bias": {5: float("nan")}},
    ],
)
def test_bad_values_are_refused_naming_the_field(params):
    with pytest.raises(InvalidRequestError, match=next(iter(params))):
        SamplingParams(max_tokens=16, **params)


def test_penalised_rows_batched_and_preempted_generate_what_each_generates_alone(model_dir):
    """The token counts kept between steps survive a preemption (the row is refilled) and
    never mix rows: a tight KV cache, mixed settings, the same tokens as each alone."""
    prompts = ["The quick brown fox", "Paris", "Numbers 0 1 2 3", "Many tenants share"]
    settings = [
        {"repetition_penalty": 1.6},
        {"frequency_penalty": 1.5, "presence_penalty": 0.5},
        {},
        {"repetition_penalty": 0.8, "logit_bias": {5: 2.0}, "min_p": 0.2},
    ]
    params = [SamplingParams(temperature=0, max_tokens=14, ignore_eos=True, **s) for s in settings]
    roomy = LLMEngine(model=model_dir, kv_cache_bytes=1 << 20)
    alone = [roomy.generate([p], sp)[0].token_ids for p, sp in zip(prompts, params, strict=True)]
    block_bytes = EngineConfig(model=model_dir, block_size=4).kv_block_bytes
    tight = LLMEngine(model=model_dir, block_size=4, kv_cache_bytes=10 * block_bytes)
    together = [out.token_ids for out in tight.generate(prompts, params)]
    assert tight.metrics.preemptions > 0
    assert together == alone
