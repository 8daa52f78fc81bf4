"""Batched prompts on /v1/completions, in every shape OpenAI takes: a list of texts or of
token-id lists, each prompt its own `n` choices, numbered prompt-major (prompt p, choice j ->
index p * n + j), usage summed over the batch, a stream's chunks carrying each choice's index.

Live against `manage.py serve` with the tiny model; each answer is checked against the same
prompts sent one at a time.
"""

import pytest

from inference.engine.tokenizer import Tokenizer
from inference.openai.prompts import MAX_PROMPTS
from inference.openai.protocol import MAX_ENGINE_REQUESTS
from tests.clients import http, refusal, sse_events
from tests.inference.conftest import BASE_NAME
from tests.inference.openai.schema import assert_fits

pytestmark = pytest.mark.django_db  # the server reads rows committed by serve_data
TEXTS = ["Once upon a time", "The capital of France is", "1 2 3"]
SEED = 99
SAMPLED = {"model": "pirate", "max_tokens": 5, "temperature": 1.0, "seed": SEED}


def complete(server, **body) -> dict:
    response = http(server, "POST", "/v1/completions", key=server.key_a, json=body)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture(scope="module")
def token_batch(live_engine_server) -> list[list[int]]:
    tokenizer = Tokenizer.from_folder(live_engine_server.base_dir)
    return [tokenizer.encode(text) for text in TEXTS]


@pytest.mark.parametrize("shape", ["texts", "token ids"])
def test_a_batch_answers_each_prompt_as_alone_prompt_major(live_engine_server, token_batch, shape):
    prompts = TEXTS if shape == "texts" else token_batch
    body = complete(live_engine_server, prompt=prompts, n=2, **SAMPLED)
    assert [c["index"] for c in body["choices"]] == list(range(6))
    singles = [complete(live_engine_server, prompt=p, n=2, **SAMPLED) for p in prompts]
    expected = [c["text"] for single in singles for c in single["choices"]]
    assert [c["text"] for c in body["choices"]] == expected  # prompt p, choice j: p * 2 + j
    for name in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert body["usage"][name] == sum(single["usage"][name] for single in singles)
    assert body["usage"]["prompt_tokens"] == sum(map(len, token_batch))
    assert_fits("CreateCompletionResponse", body)


def test_a_list_of_one_text_is_that_text(live_engine_server):
    one = complete(live_engine_server, prompt=[TEXTS[0]], **SAMPLED)
    alone = complete(live_engine_server, prompt=TEXTS[0], **SAMPLED)
    assert (one["choices"], one["usage"]) == (alone["choices"], alone["usage"])


def test_a_streamed_batch_carries_each_choices_index(live_engine_server):
    whole = complete(live_engine_server, prompt=TEXTS, n=2, logprobs=1, **SAMPLED)
    response = http(
        live_engine_server,
        "POST",
        "/v1/completions",
        key=live_engine_server.key_a,
        json={
            "prompt": TEXTS,
            "n": 2,
            "logprobs": 1,
            "stream": True,
            "stream_options": {"include_usage": True},
            **SAMPLED,
        },
    )
    chunks = sse_events(response)
    texts: dict[int, str] = {}
    tokens: dict[int, list] = {}
    for chunk in chunks[:-1]:
        (choice,) = chunk["choices"]
        texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
        tokens.setdefault(choice["index"], []).extend(choice["logprobs"]["tokens"])
    assert texts == {c["index"]: c["text"] for c in whole["choices"]}
    assert tokens == {c["index"]: c["logprobs"]["tokens"] for c in whole["choices"]}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]


def test_the_openai_client_sends_a_batch(live_engine_server):
    reply = live_engine_server.openai().completions.create(
        model=BASE_NAME, prompt=TEXTS[:2], max_tokens=2, temperature=0
    )
    assert [c.index for c in reply.choices] == [0, 1]


def test_a_prompt_too_long_for_the_context_is_named_by_its_place(live_engine_server):
    body = {"model": BASE_NAME, "prompt": [[5] * 4, [5] * 600], "max_tokens": 1}
    error = refusal(live_engine_server, "completions", body)
    assert error["code"] == "context_length_exceeded" and error["param"] == "prompt"
    assert error["message"].startswith("prompt[1] is 600 tokens")


@pytest.mark.parametrize(
    "prompt, says",
    [
        ([], "non-empty"),
        ([[]], "prompt[0] must not be an empty list"),
        (["a", ""], "prompt[1] must not be empty"),
        (["a", [1, 2]], "only texts or only token-id lists"),
        ([1, "a"], "only texts or only token-id lists"),
        ([[1, 2], 3], "only texts or only token-id lists"),
        ([[1, -1]], "prompt[0] holds -1"),
        ([[1, 2], [3, 1_000_000]], "prompt[1] holds token id 1000000, outside the vocabulary"),
        ([1_000_000], "prompt holds token id 1000000, outside the vocabulary"),
        ([[1.5]], "prompt[0] holds 1.5"),
        ([[True]], "prompt[0] holds True"),
        ([[[1]]], "prompt[0] holds [1]"),
        ([{"text": "a"}], "only texts or only token-id lists"),
        (["a"] * (MAX_PROMPTS + 1), f"at most {MAX_PROMPTS}"),
    ],
)
def test_a_bad_batch_is_a_400_naming_prompt(live_engine_server, prompt, says):
    body = {"model": BASE_NAME, "prompt": prompt, "max_tokens": 1}
    error = refusal(live_engine_server, "completions", body)
    assert error["param"] == "prompt" and says in error["message"], error["message"]


def test_a_batch_of_too_many_generations_is_refused(live_engine_server):
    prompts = ["a"] * MAX_PROMPTS
    n = MAX_ENGINE_REQUESTS // MAX_PROMPTS
    body = {"model": BASE_NAME, "prompt": prompts, "max_tokens": 1, "n": n + 1}
    error = refusal(live_engine_server, "completions", body)
    assert error["param"] == "prompt" and f"at most {MAX_ENGINE_REQUESTS}" in error["message"]
