"""`echo` on /v1/completions, as evaluation harnesses use it: the text begins with the prompt,
and with `logprobs` the legacy logprobs cover the prompt's tokens (the first one's `null`),
also with `max_tokens: 0` (the prompt alone).

The first tests render engine outputs into bodies; the live ones run against `manage.py
serve` with the tiny model and a PEFT adapter, checked against the engine's own
`prompt_logprobs` and against transformers + PEFT run directly.
"""

import copy

import pytest
import torch
from peft import PeftModel

from inference.engine import RequestOutput, TokenLogprob
from inference.engine.tokenizer import Tokenizer
from inference.openai.completion_builder import CompletionBuilder
from inference.openai.echo import EchoedPrompt
from inference.openai.logprob_entries import MIN_LOGPROB
from registry.demo.training import load_base, quietly
from tests.clients import http, refusal, sse_events
from tests.inference.conftest import BASE_NAME
from tests.inference.openai.schema import assert_fits, schema_problems

pytestmark = pytest.mark.django_db  # the server reads rows committed by serve_data
ASCII = "The quick brown fox jumps over"
UNICODE = "Héllo wörld, naïve café 🙂 ∞"


# ---------------------------------------------------------------- rendering


def output(text: str, token: int, logprob: float, *, finished=True, prompt_logprobs=None):
    return RequestOutput(
        request_id="r",
        new_token_ids=[token],
        new_text=text,
        new_logprobs=[TokenLogprob(token, logprob, [(token, logprob), (9, -3.0)])],
        finished=finished,
        finish_reason="length" if finished else None,
        prompt_tokens=3,
        completion_tokens=1,
        prompt_logprobs=prompt_logprobs,
    )


PROMPT_LPS = [
    None,
    TokenLogprob(6, -0.5, [(6, -0.5), (8, -1.5)], rank=1),
    TokenLogprob(7, float("-inf"), [(8, -0.1), (6, -2.5)], rank=300),
]
ECHO = EchoedPrompt(text="abcdef", token_ids=[5, 6, 7], offsets=[0, 2, 4])


def echo_builder(**kwargs) -> CompletionBuilder:
    return CompletionBuilder(
        kind="text", model="m", decode_token=lambda t: f"<{t}>", echo=[ECHO], **kwargs
    )


def test_an_echo_begins_the_text_and_the_legacy_logprobs_with_the_prompt():
    builder = echo_builder(logprobs=1)
    builder.add(0, output("xy", 9, -0.25, prompt_logprobs=PROMPT_LPS))
    (choice,) = builder.final_body()["choices"]
    assert choice["text"] == "abcdefxy"
    assert choice["logprobs"] == {
        "tokens": ["<5>", "<6>", "<7>", "<9>"],
        "token_logprobs": [None, -0.5, MIN_LOGPROB, -0.25],  # JSON has no -inf
        "top_logprobs": [None, {"<6>": -0.5}, {"<8>": -0.1}, {"<9>": -0.25}],
        "text_offset": [0, 2, 4, 6],  # the generated token after the prompt's text
    }


def test_max_tokens_zero_echoes_the_prompt_alone():
    builder = echo_builder(logprobs=0, echo_only=True)
    builder.add(0, output("xy", 9, -0.25, prompt_logprobs=PROMPT_LPS))
    body = builder.final_body()
    (choice,) = body["choices"]
    assert choice["text"] == "abcdef" and choice["finish_reason"] == "length"
    assert choice["logprobs"]["tokens"] == ["<5>", "<6>", "<7>"]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 0, "total_tokens": 3}


def test_without_logprobs_an_echo_is_the_text_alone():
    builder = echo_builder()
    builder.add(0, output("xy", 9, -0.25))
    (choice,) = builder.final_body()["choices"]
    assert choice["text"] == "abcdefxy" and choice["logprobs"] is None


def test_a_stream_sends_the_echo_in_each_choices_first_chunk():
    builder = echo_builder(logprobs=0, n=2)
    first = builder.add(1, output("x", 9, -0.25, finished=False, prompt_logprobs=PROMPT_LPS))
    (choice,) = first["choices"]
    assert choice["index"] == 1 and choice["text"] == "abcdefx"
    assert choice["logprobs"]["text_offset"] == [0, 2, 4, 6]
    later = builder.add(1, output("y", 9, -0.5))["choices"][0]
    assert later["text"] == "y" and later["logprobs"]["text_offset"] == [7]
    other = builder.add(0, output("z", 9, -0.5))["choices"][0]  # its prompt logprobs: shared
    assert other["text"] == "abcdefz" and other["logprobs"]["token_logprobs"][1] == -0.5


# ---------------------------------------------------------------- live


def complete(server, **body) -> dict:
    payload = {"model": "pirate", "temperature": 0, **body}
    response = http(server, "POST", "/v1/completions", key=server.key_a, json=payload)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture(scope="module")
def tokenizer(live_engine_server) -> Tokenizer:
    return Tokenizer.from_folder(live_engine_server.base_dir)


@pytest.fixture(scope="module")
def reference(live_engine_server):
    """Each prompt token's logprob under transformers + PEFT (fp32), run directly."""
    base = load_base(live_engine_server.base_dir)
    model = quietly(PeftModel.from_pretrained, base, str(live_engine_server.adapter_dir)).eval()

    def logprobs(ids: list[int]) -> list[float]:
        with torch.no_grad():
            rows = model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
        return [rows[i - 1, ids[i]].item() for i in range(1, len(ids))]

    return logprobs


@pytest.mark.parametrize("prompt", [ASCII, UNICODE])
def test_echo_with_logprobs_covers_the_prompt_tokens(live_engine_server, tokenizer, prompt):
    ids = tokenizer.encode(prompt)
    body = complete(live_engine_server, prompt=prompt, echo=True, logprobs=2, max_tokens=3)
    (choice,) = body["choices"]
    generated = complete(live_engine_server, prompt=prompt, max_tokens=3)["choices"][0]["text"]
    assert choice["text"] == prompt + generated
    logprobs = choice["logprobs"]
    assert len(logprobs["tokens"]) == len(ids) + 3
    assert logprobs["tokens"][: len(ids)] == [tokenizer.decode([t]) for t in ids]
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    # the 2 most likely (keyed by text: two tokens of one text, such as a lone byte, are one)
    assert all(1 <= len(top) <= 2 for top in logprobs["top_logprobs"][1:])
    offsets = logprobs["text_offset"]
    assert offsets[0] == 0 and offsets == sorted(offsets)
    assert offsets[len(ids)] == len(prompt)  # the first generated token follows the prompt
    for i, token in enumerate(logprobs["tokens"][: len(ids)]):
        if "\ufffd" not in token:  # a whole character (not one byte of one)
            assert choice["text"].startswith(token, offsets[i])
    assert body["usage"]["prompt_tokens"] == len(ids)
    assert body["usage"]["completion_tokens"] == 3


def test_echoed_logprobs_equal_prompt_logprobs_and_a_direct_forward(
    live_engine_server, tokenizer, reference
):
    ids = tokenizer.encode(ASCII)
    echoed = complete(live_engine_server, prompt=ASCII, echo=True, logprobs=1, max_tokens=1)
    values = echoed["choices"][0]["logprobs"]["token_logprobs"][1 : len(ids)]
    plain = complete(live_engine_server, prompt=ASCII, max_tokens=1, prompt_logprobs=0)
    entries = plain["choices"][0]["prompt_logprobs"][1:]
    assert values == pytest.approx(
        [entry[str(t)]["logprob"] for entry, t in zip(entries, ids[1:], strict=True)], abs=1e-5
    )
    assert values == pytest.approx(reference(ids), abs=1e-4)


def test_max_tokens_zero_returns_the_prompt_alone(live_engine_server, tokenizer):
    ids = tokenizer.encode(ASCII)
    body = complete(live_engine_server, prompt=ASCII, echo=True, logprobs=1, max_tokens=0)
    (choice,) = body["choices"]
    assert choice["text"] == ASCII and choice["finish_reason"] == "length"
    assert len(choice["logprobs"]["tokens"]) == len(ids)
    assert body["usage"] == {
        "prompt_tokens": len(ids),
        "completion_tokens": 0,
        "total_tokens": len(ids),
    }


def test_a_token_id_prompt_echoes_as_its_text(live_engine_server, tokenizer):
    ids = tokenizer.encode(ASCII)
    body = complete(live_engine_server, prompt=ids, echo=True, max_tokens=0)
    assert body["choices"][0]["text"] == tokenizer.decode(ids) == ASCII
    assert body["choices"][0]["logprobs"] is None


def test_the_harness_call_scores_each_prompt_of_a_batch(live_engine_server, tokenizer, reference):
    """lm-evaluation-harness's loglikelihood request, as it sends it, read as it reads it."""
    batch = [tokenizer.encode(text) for text in (ASCII, "Paris is the capital of France")]
    body = complete(
        live_engine_server,
        prompt=batch,
        echo=True,
        logprobs=1,
        max_tokens=1,
        seed=1234,
    )
    choices = sorted(body["choices"], key=lambda c: c["index"])
    assert [c["index"] for c in choices] == [0, 1]
    for ids, choice in zip(batch, choices, strict=True):
        logprobs = choice["logprobs"]
        assert logprobs["token_logprobs"][1:-1] == pytest.approx(reference(ids), abs=1e-4)
        for value, top in zip(
            logprobs["token_logprobs"][1:], logprobs["top_logprobs"][1:], strict=True
        ):
            assert max(top.values()) >= value  # is_greedy compares these
    assert body["usage"]["prompt_tokens"] == sum(map(len, batch))


def test_a_streamed_echo_equals_the_whole_answer(live_engine_server):
    body = {"prompt": UNICODE, "echo": True, "logprobs": 1, "max_tokens": 4, "n": 2}
    whole = complete(live_engine_server, **body)
    response = http(
        live_engine_server,
        "POST",
        "/v1/completions",
        key=live_engine_server.key_a,
        json={"model": "pirate", "temperature": 0, "stream": True, **body},
    )
    texts, tokens, offsets = {0: "", 1: ""}, {0: [], 1: []}, {0: [], 1: []}
    for chunk in sse_events(response):
        (choice,) = chunk["choices"]
        texts[choice["index"]] += choice["text"]
        tokens[choice["index"]] += choice["logprobs"]["tokens"]
        offsets[choice["index"]] += choice["logprobs"]["text_offset"]
    for choice in whole["choices"]:
        assert texts[choice["index"]] == choice["text"]
        assert tokens[choice["index"]] == choice["logprobs"]["tokens"]
        assert offsets[choice["index"]] == choice["logprobs"]["text_offset"]


def test_an_echo_fits_openais_schema_but_for_the_first_tokens_null(live_engine_server):
    """OpenAI's published schema types every `token_logprobs` entry a number; its API (and
    vLLM) answer null for the first echoed token, which has no context."""
    body = complete(live_engine_server, prompt=ASCII, echo=True, logprobs=1, max_tokens=2, n=2)
    problems = schema_problems("CreateCompletionResponse", body)
    assert [p.split(":")[0] for p in problems] == ["choices/0/logprobs", "choices/1/logprobs"]
    numbered = copy.deepcopy(body)
    for choice in numbered["choices"]:
        choice["logprobs"]["token_logprobs"][0] = 0.0
        choice["logprobs"]["top_logprobs"][0] = {}
    assert_fits("CreateCompletionResponse", numbered)


@pytest.mark.parametrize(
    "body, param",
    [
        ({"echo": "yes"}, "echo"),
        ({"echo": 1}, "echo"),
        ({"max_tokens": 0}, "max_tokens"),  # without echo: nothing to answer
        ({"max_tokens": 0, "echo": False}, "max_tokens"),
        ({"max_tokens": -1, "echo": True}, "max_tokens"),
    ],
)
def test_bad_echo_requests_are_refused_naming_the_parameter(live_engine_server, body, param):
    error = refusal(live_engine_server, "completions", {"model": BASE_NAME, "prompt": "Hi", **body})
    assert error["param"] == param


def test_suffix_is_refused_as_unsupported(live_engine_server):
    body = {"model": BASE_NAME, "prompt": "Hi", "suffix": "the end"}
    error = refusal(live_engine_server, "completions", body)
    assert error["code"] == "unsupported_parameter" and "suffix" in error["message"]


def test_chat_refuses_echo_as_a_completions_parameter(live_engine_server):
    body = {"model": BASE_NAME, "messages": [{"role": "user", "content": "Hi"}], "echo": True}
    error = refusal(live_engine_server, "chat/completions", body)
    assert error["param"] == "echo" and error["code"] == "unsupported_parameter"


def test_the_openai_client_sends_echo(live_engine_server):
    reply = live_engine_server.openai().completions.create(
        model="pirate", prompt=ASCII, echo=True, logprobs=1, max_tokens=1, temperature=0
    )
    assert reply.choices[0].text.startswith(ASCII)
    assert reply.choices[0].logprobs.token_logprobs[0] is None
