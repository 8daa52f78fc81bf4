"""Arbitrary Unicode, lone UTF-16 surrogates included, in every text field of every endpoint
that reads text (chat, completions, responses, /tokenize, /detokenize; this server has no
embeddings endpoint) against a live `manage.py serve` with the tiny model: never a 5xx, and
every refusal the error shape with a `param`. A surrogate reached the tokenizer from a prompt
and answered 500 before; the other fields are here so no path to a template, the tokenizer,
the database or the answer's JSON is left unwalked.

Bodies travel as `json.dumps` writes them (non-ASCII escaped), the only way a lone surrogate
can: UTF-8 cannot carry one. Examples are few and derandomized, so CI stays fast and repeats.
"""

import json
from collections.abc import Callable

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.clients import TIMEOUT
from tests.inference.conftest import BASE_NAME, live_engine_server  # noqa: F401

pytestmark = pytest.mark.django_db
# Every general category, surrogates (Cs) named: Hypothesis leaves them out unless asked.
ANY_CHARACTER = st.characters(
    codec=None, categories=("L", "M", "N", "P", "S", "Z", "Cc", "Cf", "Cs", "Co", "Cn")
)
SURROGATE = st.characters(categories=["Cs"])
# About half the texts hold a surrogate somewhere; the others reach the parsers and tokenizer.
TEXT = st.one_of(
    st.text(ANY_CHARACTER, max_size=40),
    st.lists(st.one_of(ANY_CHARACTER, SURROGATE), max_size=40).map("".join),
)
FUZZ = settings(
    max_examples=25,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
USER = {"role": "user", "content": "Hi"}
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}

Body = Callable[[str], dict]

CHAT_FIELDS: dict[str, Body] = {
    "messages[0].content": lambda t: {"messages": [{"role": "user", "content": t}]},
    "system content": lambda t: {"messages": [{"role": "system", "content": t}, USER]},
    "assistant content": lambda t: {"messages": [USER, {"role": "assistant", "content": t}, USER]},
    "content part text": lambda t: {
        "messages": [{"role": "user", "content": [{"type": "text", "text": t}]}]
    },
    "message name": lambda t: {"messages": [{**USER, "name": t}]},
    "tool call arguments and result": lambda t: {
        "messages": [
            USER,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": t}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": t},
        ]
    },
    "stop": lambda t: {"messages": [USER], "stop": [t]},
    "model": lambda t: {"messages": [USER], "model": t},
    "user": lambda t: {"messages": [USER], "user": t},
    "tool description": lambda t: {
        "messages": [USER],
        "tools": [{"type": "function", "function": {"name": "f", "description": t}}],
    },
    "schema description": lambda t: {
        "messages": [USER],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "s", "schema": {"type": "object", "description": t}},
        },
    },
    "logit_bias key": lambda t: {"messages": [USER], "logit_bias": {t: 1}},
    "a field's name": lambda t: {"messages": [USER], t: 1},
}
COMPLETION_FIELDS: dict[str, Body] = {
    "prompt": lambda t: {"prompt": t},
    "prompt[1]": lambda t: {"prompt": ["Hi", t]},
    "stop": lambda t: {"prompt": "Hi", "stop": t},
    "suffix": lambda t: {"prompt": "Hi", "suffix": t},
    "model": lambda t: {"prompt": "Hi", "model": t},
    "a field's name": lambda t: {"prompt": "Hi", t: None},
}
RESPONSES_FIELDS: dict[str, Body] = {
    "input": lambda t: {"input": t},
    "input[0].content[0].text": lambda t: {
        "input": [{"role": "user", "content": [{"type": "input_text", "text": t}]}]
    },
    "instructions": lambda t: {"input": "Hi", "instructions": t},
    "metadata value": lambda t: {"input": "Hi", "metadata": {"k": t}},
    "metadata key": lambda t: {"input": "Hi", "metadata": {t: "v"}},
    "function call and output": lambda t: {
        "input": [
            {"role": "user", "content": "Hi"},
            {"type": "function_call", "call_id": t, "name": "lookup", "arguments": t},
            {"type": "function_call_output", "call_id": t, "output": t},
        ],
        "tools": [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}],
    },
    "tool description": lambda t: {
        "input": "Hi",
        "tools": [{"type": "function", "name": "f", "description": t}],
    },
    "previous_response_id": lambda t: {"input": "Hi", "previous_response_id": t},
    "text.format name": lambda t: {
        "input": "Hi",
        "text": {"format": {"type": "json_schema", "name": t, "schema": {"type": "object"}}},
    },
}
TOKENIZE_FIELDS: dict[str, Body] = {
    "prompt": lambda t: {"prompt": t},
    "messages[0].content": lambda t: {"messages": [{"role": "user", "content": t}]},
    "model": lambda t: {"prompt": "Hi", "model": t},
}
DETOKENIZE_FIELDS: dict[str, Body] = {
    "model": lambda t: {"tokens": [5, 6], "model": t},
    "a field's name": lambda t: {"tokens": [5], t: 1},
}
LIMITS = {
    "/v1/chat/completions": {"max_tokens": 1},
    "/v1/completions": {"max_tokens": 1},
    "/v1/responses": {"max_output_tokens": 1},
}


def assert_not_a_server_error(server, path: str, body: dict) -> None:
    payload = {"model": BASE_NAME, **LIMITS.get(path, {}), **body}
    answer = httpx.post(
        f"{server.url}{path}",
        content=json.dumps(payload).encode("ascii"),
        headers={"Authorization": f"Bearer {server.key_a}"},
        timeout=TIMEOUT,
    )
    assert answer.status_code < 500, answer.text[:500]
    if answer.status_code != 200:
        error = answer.json()["error"]
        assert error["code"] and error["message"], error
        assert error["param"] is None or isinstance(error["param"], str), error


def fuzzes(path: str, fields: dict[str, Body]):
    @FUZZ
    @given(field=st.sampled_from(sorted(fields)), text=TEXT)
    def run(live_engine_server, field, text):  # noqa: F811  (the fixture)
        assert_not_a_server_error(live_engine_server, path, fields[field](text))

    return run


test_chat_text_fields = fuzzes("/v1/chat/completions", CHAT_FIELDS)
test_completion_text_fields = fuzzes("/v1/completions", COMPLETION_FIELDS)
test_responses_text_fields = fuzzes("/v1/responses", RESPONSES_FIELDS)
test_tokenize_text_fields = fuzzes("/tokenize", TOKENIZE_FIELDS)
test_detokenize_text_fields = fuzzes("/detokenize", DETOKENIZE_FIELDS)


def test_the_server_logged_no_error(live_engine_server):  # noqa: F811
    assert "Traceback" not in live_engine_server.log.read_text()
