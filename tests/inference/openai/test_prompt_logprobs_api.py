"""`prompt_logprobs` (vLLM's extension, sent with the `openai` client's `extra_body`): the
logprob of every prompt token, in vLLM's response shape, on chat and completions.

The first tests render engine outputs into response bodies; the live ones run the real
`openai` client against `manage.py serve` with the tiny model.
"""

import math

import openai
import pytest

from inference.engine import RequestOutput, TokenLogprob
from inference.engine.tokenizer import Tokenizer
from inference.openai.completion_builder import CompletionBuilder
from inference.openai.logprob_entries import MIN_LOGPROB
from tests.clients import refusal
from tests.inference.conftest import BASE_NAME

# The server reads rows committed by the module's fixtures; tests change them only over HTTP.
pytestmark = pytest.mark.django_db
QUESTION = [{"role": "user", "content": "What is a prompt?"}]
PROMPT = [17, 42, 99, 7, 130, 64]  # token ids


# ---------------------------------------------------------------- rendering


def first_output(prompt_logprobs) -> RequestOutput:
    return RequestOutput(
        request_id="r-0",
        new_token_ids=[9],
        new_text="x",
        new_logprobs=[],
        finished=True,
        finish_reason="length",
        prompt_tokens=3,
        completion_tokens=1,
        prompt_logprobs=prompt_logprobs,
    )


PROMPT_LOGPROBS = [
    None,
    TokenLogprob(token_id=5, logprob=-0.5, top=[(5, -0.5), (6, -1.5)], rank=1),
    TokenLogprob(token_id=7, logprob=float("-inf"), top=[(6, -0.1), (8, -2.5)], rank=300),
]


def builder(kind: str, k: int, n: int = 1) -> CompletionBuilder:
    return CompletionBuilder(
        kind=kind, model="m", decode_token=lambda tid: f"<{tid}>", n=n, prompt_logprobs=k
    )


def test_prompt_logprobs_render_as_vllm_does():
    text = builder("text", k=2, n=2)
    text.add(0, first_output(PROMPT_LOGPROBS))
    text.add(1, first_output(None))  # only choice 0 asks the engine for them
    body = text.final_body()
    expected = [
        None,
        {"5": {"logprob": -0.5, "rank": 1, "decoded_token": "<5>"},  # the prompt token is top
         "6": {"logprob": -1.5, "rank": 2, "decoded_token": "<6>"}},
        {"7": {"logprob": MIN_LOGPROB, "rank": 300, "decoded_token": "<7>"},  # JSON has no -inf
         "6": {"logprob": -0.1, "rank": 1, "decoded_token": "<6>"},
         "8": {"logprob": -2.5, "rank": 2, "decoded_token": "<8>"}},
    ]  # fmt: skip
    assert [c["prompt_logprobs"] for c in body["choices"]] == [expected, expected]
    assert "prompt_logprobs" not in body  # completions: in each choice

    chat = builder("chat", k=1)
    chat.add(0, first_output(PROMPT_LOGPROBS))
    body = chat.final_body()
    assert list(body["prompt_logprobs"][2]) == ["7", "6"]  # the prompt token, then the top k
    assert all("prompt_logprobs" not in c for c in body["choices"])  # chat: beside them


def test_without_prompt_logprobs_the_bodies_are_unchanged():
    for kind in ("chat", "text"):
        plain = CompletionBuilder(kind=kind, model="m", decode_token=str)
        plain.add(0, first_output(None))
        body = plain.final_body()
        assert "prompt_logprobs" not in body and "prompt_logprobs" not in body["choices"][0]


# ---------------------------------------------------------------- live


def assert_prompt_logprobs(entries, prompt_ids: list[int], k: int):
    assert len(entries) == len(prompt_ids) and entries[0] is None
    for entry, token_id in zip(entries[1:], prompt_ids[1:], strict=True):
        assert str(token_id) in entry  # keyed by the prompt token's id, as a JSON string
        assert k <= len(entry) <= k + 1  # the prompt token and the top k
        for value in entry.values():
            assert math.isfinite(value["logprob"]) and value["logprob"] <= 0
            assert value["rank"] >= 1 and isinstance(value["decoded_token"], str)
        ranked = sorted(entry.values(), key=lambda v: v["rank"])
        assert ranked[0]["logprob"] == max(v["logprob"] for v in entry.values())


def test_chat_returns_the_prompt_logprobs_beside_the_choices(live_engine_server):
    reply = live_engine_server.openai().chat.completions.create(
        model=BASE_NAME,
        messages=QUESTION,
        max_tokens=3,
        temperature=0,
        n=2,
        extra_body={"prompt_logprobs": 1},
    )
    tokenizer = Tokenizer.from_folder(live_engine_server.base_dir)
    text = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True)
    prompt_ids = tokenizer.encode(text, add_special_tokens=False)
    assert reply.usage.prompt_tokens == len(prompt_ids)
    assert_prompt_logprobs(reply.model_extra["prompt_logprobs"], prompt_ids, k=1)
    assert len(reply.choices) == 2


def test_completions_return_them_in_each_choice_keyed_by_the_prompt_token_ids(live_engine_server):
    client = live_engine_server.openai()
    reply = client.completions.create(
        model="pirate",
        prompt=PROMPT,
        max_tokens=2,
        temperature=0,
        n=2,
        extra_body={"prompt_logprobs": 3},
    )
    first, second = (c.model_extra["prompt_logprobs"] for c in reply.choices)
    assert_prompt_logprobs(first, PROMPT, k=3)
    assert second == first  # the same prompt: the same logprobs, in every choice
    assert reply.usage.prompt_tokens == len(PROMPT)
    # aligned with generation: at the last prompt position, the most likely token and its
    # logprob are what a greedy completion of the prompt before it picks first
    before = client.completions.create(
        model="pirate", prompt=PROMPT[:-1], max_tokens=1, temperature=0, logprobs=1
    )
    best = min(first[-1].values(), key=lambda v: v["rank"])
    assert best["decoded_token"] == before.choices[0].logprobs.tokens[0]
    assert best["logprob"] == pytest.approx(before.choices[0].logprobs.token_logprobs[0], abs=1e-3)


def test_prompt_logprobs_zero_is_the_prompt_tokens_alone(live_engine_server):
    reply = live_engine_server.openai().completions.create(
        model=BASE_NAME, prompt=PROMPT, max_tokens=1, extra_body={"prompt_logprobs": 0}
    )
    entries = reply.choices[0].model_extra["prompt_logprobs"]
    assert_prompt_logprobs(entries, PROMPT, k=0)
    assert [list(e) for e in entries[1:]] == [[str(t)] for t in PROMPT[1:]]


@pytest.mark.parametrize(
    "extra, path",
    [
        ({"prompt_logprobs": 21}, "/v1/completions"),
        ({"prompt_logprobs": -1}, "/v1/chat/completions"),
        ({"prompt_logprobs": "1"}, "/v1/completions"),
        ({"prompt_logprobs": True}, "/v1/chat/completions"),
        ({"prompt_logprobs": 1, "stream": True}, "/v1/chat/completions"),  # as vLLM refuses it
        ({"prompt_logprobs": 0, "stream": True}, "/v1/completions"),
    ],
)
def test_bad_prompt_logprobs_are_refused_naming_them(live_engine_server, extra, path):
    body = {"model": BASE_NAME, "max_tokens": 2, **extra}
    body.update({"messages": QUESTION} if "chat" in path else {"prompt": PROMPT})
    error = refusal(live_engine_server, path.removeprefix("/v1/"), body)
    assert error["param"] == "prompt_logprobs"


def test_the_openai_client_surfaces_the_refusal(live_engine_server):
    with pytest.raises(openai.BadRequestError) as caught:
        live_engine_server.openai().completions.create(
            model=BASE_NAME, prompt=PROMPT, max_tokens=1, extra_body={"prompt_logprobs": 99}
        )
    assert caught.value.body["param"] == "prompt_logprobs"
    assert "from 0 to 20" in caught.value.body["message"]
