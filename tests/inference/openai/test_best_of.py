"""`best_of` on /v1/completions, with vLLM's semantics: `best_of` candidates generated per
prompt (candidate i sampling with `seed + i`, as choices do), the `n` with the highest
cumulative logprob returned, most likely first; usage counts every candidate's tokens;
`best_of` below `n`, or above it in a stream, is a 400.

The first test ranks engine outputs in the builder; the live ones compare against the same
candidates asked for as `n` choices, whose logprobs say which are the most likely.
"""

import pytest

from inference.engine import RequestOutput, TokenLogprob
from inference.openai.best_of import best_n
from inference.openai.completion_builder import CompletionBuilder
from inference.openai.protocol import MAX_CHOICES, MAX_SEED
from tests.clients import http, refusal
from tests.inference.conftest import BASE_NAME

pytestmark = pytest.mark.django_db  # the server reads rows committed by serve_data
SEED = 4321
SAMPLED = {"model": "pirate", "max_tokens": 6, "temperature": 1.0, "ignore_eos": True}


def output(text: str, logprobs: list[float]) -> RequestOutput:
    return RequestOutput(
        request_id="r",
        new_token_ids=[5] * len(logprobs),
        new_text=text,
        new_logprobs=[TokenLogprob(5, value, []) for value in logprobs],
        finished=True,
        finish_reason="length",
        prompt_tokens=2,
        completion_tokens=len(logprobs),
    )


def test_the_n_most_likely_candidates_of_each_prompt_are_returned_in_order():
    builder = CompletionBuilder(kind="text", model="m", decode_token=str, n=2, best_of=3, prompts=2)
    for index, (text, logprobs) in enumerate(
        [
            ("a", [-1.0, -2.0]),
            ("b", [-0.5]),
            ("c", [-0.1, -0.2]),
            ("d", [-9.0]),
            ("e", [-1.0]),
            ("f", [-0.5]),
        ]
    ):
        builder.add(index, output(text, logprobs))
    body = builder.final_body()
    assert [(c["index"], c["text"]) for c in body["choices"]] == [
        (0, "c"),  # -0.3
        (1, "b"),  # -0.5 (a, at -3.0, is dropped)
        (2, "f"),
        (3, "e"),
    ]
    assert all(c["logprobs"] is None for c in body["choices"])  # not asked for
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 8, "total_tokens": 12}


def test_ties_keep_the_candidates_order():
    assert best_n(["x", "y", "z"], 2, lambda c: 0.0) == ["x", "y"]


# ---------------------------------------------------------------- live


def complete(server, **body) -> dict:
    response = http(server, "POST", "/v1/completions", key=server.key_a, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def cumulative(choice: dict) -> float:
    return sum(choice["logprobs"]["token_logprobs"])


@pytest.mark.parametrize("n", [1, 2])
def test_best_of_returns_the_most_likely_of_the_candidates(live_engine_server, n):
    prompts = ["Once upon a time", "The sea"]
    body = complete(live_engine_server, prompt=prompts, best_of=4, n=n, seed=SEED, **SAMPLED)
    assert [c["index"] for c in body["choices"]] == list(range(2 * n))
    for p, prompt in enumerate(prompts):
        candidates = complete(
            live_engine_server, prompt=prompt, n=4, seed=SEED, logprobs=0, **SAMPLED
        )
        ranked = sorted(candidates["choices"], key=cumulative, reverse=True)
        returned = body["choices"][p * n : (p + 1) * n]
        assert [c["text"] for c in returned] == [c["text"] for c in ranked[:n]]
        assert len({c["text"] for c in candidates["choices"]}) > 1  # a real choice was made
    assert body["usage"]["completion_tokens"] == 2 * 4 * 6  # every candidate's tokens
    assert all(c["logprobs"] is None for c in body["choices"])


def test_best_of_with_logprobs_shows_the_returned_choices_own(live_engine_server):
    body = complete(
        live_engine_server, prompt="The sea", best_of=3, seed=SEED, logprobs=2, **SAMPLED
    )
    (choice,) = body["choices"]
    candidates = complete(
        live_engine_server, prompt="The sea", n=3, seed=SEED, logprobs=2, **SAMPLED
    )
    best = max(candidates["choices"], key=cumulative)
    assert choice["text"] == best["text"] and choice["logprobs"] == best["logprobs"]


def test_best_of_equal_to_n_streams(live_engine_server):
    response = http(
        live_engine_server,
        "POST",
        "/v1/completions",
        key=live_engine_server.key_a,
        json={"prompt": "Hi", "best_of": 2, "n": 2, "stream": True, "seed": SEED, **SAMPLED},
    )
    assert response.status_code == 200 and response.text.endswith("data: [DONE]\n\n")


@pytest.mark.parametrize(
    "body, param, says",
    [
        ({"best_of": 1, "n": 2}, "best_of", "at least n"),
        ({"best_of": 3, "n": 2, "stream": True}, "best_of", "stream"),
        ({"best_of": 2, "stream": True}, "best_of", "stream"),
        ({"best_of": 0}, "best_of", f"from 1 to {MAX_CHOICES}"),
        ({"best_of": MAX_CHOICES + 1}, "best_of", f"from 1 to {MAX_CHOICES}"),
        ({"best_of": "2"}, "best_of", "integer"),
        ({"best_of": True}, "best_of", "integer"),
        ({"best_of": 2.5}, "best_of", "integer"),
        ({"best_of": 3, "seed": MAX_SEED - 1}, "seed", "candidate i samples with seed + i"),
    ],
)
def test_a_bad_best_of_is_a_400_naming_it(live_engine_server, body, param, says):
    error = refusal(
        live_engine_server,
        "completions",
        {"model": BASE_NAME, "prompt": "Hi", "max_tokens": 1, **body},
    )
    assert error["param"] == param and says in error["message"], error["message"]


def test_chat_refuses_best_of_as_a_completions_parameter(live_engine_server):
    body = {"model": BASE_NAME, "messages": [{"role": "user", "content": "Hi"}], "best_of": 2}
    error = refusal(live_engine_server, "chat/completions", body)
    assert error["param"] == "best_of" and error["code"] == "unsupported_parameter"
