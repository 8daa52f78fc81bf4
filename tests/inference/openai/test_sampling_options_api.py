"""Penalties, logit_bias and vLLM's sampling extras over HTTP with the real `openai` client
(the extras through `extra_body`, as vLLM's users send them), against `manage.py serve` with
the tiny model and its adapter."""

import json

import jsonschema  # type: ignore[import-untyped]
import pytest

from inference.engine.tokenizer import Tokenizer
from tests.clients import http
from tests.engine.structured_output_schemas import NESTED
from tests.inference.conftest import BASE_NAME

pytestmark = pytest.mark.django_db
PROMPT = "Once upon a time"
QUESTION = [{"role": "user", "content": "Describe a person."}]


@pytest.fixture(scope="module")
def tokenizer(live_engine_server):
    return Tokenizer.from_folder(live_engine_server.base_dir)


@pytest.fixture(scope="module")
def word(tokenizer):
    """A token with text of its own, to push and stop on."""
    return tokenizer.encode("hello", add_special_tokens=False)[0]


def complete(server, **body):
    body = {"model": BASE_NAME, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, **body}
    return server.openai().completions.create(**body)


@pytest.mark.parametrize("model", [BASE_NAME, "pirate"])
def test_every_option_at_once_on_both_models(live_engine_server, model, word):
    reply = live_engine_server.openai().chat.completions.create(
        model=model,
        messages=QUESTION,
        max_tokens=12,
        temperature=0.8,
        seed=3,
        n=2,
        presence_penalty=0.5,
        frequency_penalty=0.3,
        logit_bias={str(word): 5},
        extra_body={
            "repetition_penalty": 1.2,
            "top_k": 40,
            "min_p": 0.05,
            "min_tokens": 4,
            "stop_token_ids": [word + 1],
            "ignore_eos": False,
            "skip_special_tokens": True,
            "include_stop_str_in_output": False,
        },
    )
    assert len(reply.choices) == 2
    assert all(c.finish_reason in ("stop", "length") for c in reply.choices)
    assert reply.usage.completion_tokens >= 2 * 4


def test_logit_bias_of_100_makes_greedy_pick_the_token(live_engine_server, tokenizer, word):
    for model in (BASE_NAME, "pirate"):
        reply = complete(live_engine_server, model=model, logit_bias={str(word): 100})
        assert reply.choices[0].text == tokenizer.decode([word] * 8)


def test_min_tokens_delays_the_end(live_engine_server, tokenizer):
    eos = tokenizer.eos_token_ids[0]
    ending = {"logit_bias": {str(eos): 100}, "max_tokens": 16}
    at_once = complete(live_engine_server, **ending)
    assert at_once.choices[0].finish_reason == "stop" and at_once.usage.completion_tokens == 1
    held = complete(live_engine_server, **ending, extra_body={"min_tokens": 5})
    assert held.choices[0].finish_reason == "stop"
    assert held.usage.completion_tokens == 6  # five tokens, then the end the bias wants


def test_stop_token_ids_stop_and_include_stop_str_in_output_keeps_the_text(
    live_engine_server, tokenizer, word
):
    forced = {"logit_bias": {str(word): 100}, "max_tokens": 8}
    stopped = complete(live_engine_server, **forced, extra_body={"stop_token_ids": [word]})
    assert stopped.choices[0].finish_reason == "stop" and stopped.choices[0].text == ""
    assert stopped.usage.completion_tokens == 1
    kept = complete(
        live_engine_server,
        **forced,
        extra_body={"stop_token_ids": [word], "include_stop_str_in_output": True},
    )
    assert kept.choices[0].text == tokenizer.decode([word])


def test_include_stop_str_in_output_keeps_a_stop_string(live_engine_server):
    full = complete(live_engine_server, max_tokens=16, extra_body={"ignore_eos": True}).choices[0]
    stop = full.text[len(full.text) // 2 :][:3]
    cut = full.text.find(stop)
    assert len(stop) == 3 and cut > 0
    body = {"max_tokens": 16, "stop": [stop]}
    dropped = complete(live_engine_server, **body, extra_body={"ignore_eos": True}).choices[0]
    kept = complete(
        live_engine_server,
        **body,
        extra_body={"ignore_eos": True, "include_stop_str_in_output": True},
    ).choices[0]
    assert dropped.text == full.text[:cut] and dropped.finish_reason == "stop"
    assert kept.text == full.text[: cut + len(stop)] and kept.finish_reason == "stop"


@pytest.mark.parametrize("model", [BASE_NAME, "pirate"])
def test_a_structured_output_holds_whatever_the_bias_and_penalties(
    live_engine_server, tokenizer, model
):
    """+100 on every token JSON never starts with, and penalties that favour repeats: the
    grammar still decides."""
    banned = tokenizer.encode("Sure! Here you go", add_special_tokens=False)
    reply = live_engine_server.openai().chat.completions.create(
        model=model,
        messages=QUESTION,
        max_tokens=80,
        temperature=1.0,
        seed=11,
        logit_bias={str(t): 100 for t in banned},
        presence_penalty=-2,
        frequency_penalty=-2,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": NESTED, "strict": True},
        },
        extra_body={"repetition_penalty": 0.5, "min_p": 0.1, "min_tokens": 3},
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), NESTED)


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"logit_bias": {"99999999": 1}}, "logit_bias"),
        ({"stop_token_ids": [99999999]}, "stop_token_ids"),
        ({"min_tokens": 9}, "min_tokens"),  # above max_tokens
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"logit_bias": {"5": 300}}, "logit_bias"),
    ],
)
def test_bad_values_are_400s_naming_the_parameter(live_engine_server, extra, param):
    body = {"model": BASE_NAME, "prompt": PROMPT, "max_tokens": 8, **extra}
    answer = http(
        live_engine_server, "POST", "/v1/completions", key=live_engine_server.key_a, json=body
    )
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param
