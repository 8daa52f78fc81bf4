"""Tokenizing is bounded before it starts: a text longer than max_model_len x
LORAPLEX_MAX_CHARS_PER_TOKEN characters is a 400 naming its field on every endpoint, and the
tokenizer never sees it (the server's count of characters tokenized, on /metrics, does not
move); /tokenize answers and /detokenize takes at most max_model_len tokens.

Before, /tokenize took whatever the body held (a megabyte: 883,837 ids, 14 MB of answer) and
a chat prompt of 660k characters was refused only after tokenizing it. The tiny model's
context is 512 tokens and its longest token 13 characters, so the bound here is 512 x 8 =
4,096 characters.
"""

import re

import pytest

from tests.clients import http, metric
from tests.inference.conftest import BASE_NAME

pytestmark = pytest.mark.django_db
CONTEXT = 512
LIMIT = CONTEXT * 8  # LORAPLEX_MAX_CHARS_PER_TOKEN's default, below the longest token's 13
TOO_LONG = "a" * (LIMIT + 1)
USER = [{"role": "user", "content": "Hi"}]


def tokenized_characters(server) -> float:
    return metric(server, "loraplex_tokenized_characters_total")


def refused_too_long(server) -> float:
    text = http(server, "GET", "/metrics").text
    found = re.search(
        r'^loraplex_tokenizations_refused_total\{reason="too_long"\} (\S+)$', text, re.M
    )
    return float(found.group(1)) if found else 0.0


def assert_refused_untokenized(server, path: str, body: dict, param: str) -> dict:
    """`body` at `path`: 400 `context_length_exceeded` naming `param`, with nothing tokenized."""
    before, refusals = tokenized_characters(server), refused_too_long(server)
    answer = http(server, "POST", path, key=server.key_a, json={"model": BASE_NAME, **body})
    assert answer.status_code == 400, answer.text[:300]
    error = answer.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == param, error
    assert (
        f"at most {LIMIT}" in error["message"]
        and "LORAPLEX_MAX_CHARS_PER_TOKEN" in error["message"]
    )
    assert tokenized_characters(server) == before
    assert refused_too_long(server) == refusals + 1
    return error


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/tokenize", {"prompt": TOO_LONG}, "prompt"),
        ("/tokenize", {"messages": [{"role": "user", "content": TOO_LONG}]}, "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": TOO_LONG}]}, "messages"),
        ("/v1/completions", {"prompt": TOO_LONG}, "prompt"),
        ("/v1/responses", {"input": TOO_LONG}, "input"),
        ("/v1/responses", {"input": "Hi", "instructions": TOO_LONG}, "input"),
    ],
)
def test_a_text_over_the_bound_is_refused_before_tokenizing(live_engine_server, path, body, param):
    assert_refused_untokenized(live_engine_server, path, body, param)


def test_a_batch_names_the_prompt_over_the_bound(live_engine_server):
    error = assert_refused_untokenized(
        live_engine_server, "/v1/completions", {"prompt": ["fine", TOO_LONG]}, "prompt"
    )
    assert error["message"].startswith("prompt[1] is")


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
def test_a_conversation_is_bounded_as_its_template_renders_it(live_engine_server, path):
    """Short contents, many turns: the template's own text puts it over, and the rendered
    text is measured before it is tokenized."""
    messages = [{"role": "user", "content": "x"}] * 300  # ~29 characters each once rendered
    error = assert_refused_untokenized(live_engine_server, path, {"messages": messages}, "messages")
    assert error["message"].startswith("The rendered conversation is")


def test_tokenize_answers_at_most_the_context(live_engine_server):
    """600 characters the tiny vocabulary splits into bytes: within the characters, past the
    context in tokens."""
    within = http(
        live_engine_server,
        "POST",
        "/tokenize",
        key=live_engine_server.key_a,
        json={"prompt": "Ω" * 200},
    )
    assert within.status_code == 200, within.text
    per_char = within.json()["count"] / 200
    assert per_char >= 1  # so 600 of them are more tokens than the context holds
    answer = http(
        live_engine_server,
        "POST",
        "/tokenize",
        key=live_engine_server.key_a,
        json={"prompt": "Ω" * 600},
    )
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "prompt"
    assert f"max_model_len {CONTEXT}" in error["message"]


def test_detokenize_takes_at_most_the_context(live_engine_server):
    ok = http(
        live_engine_server,
        "POST",
        "/detokenize",
        key=live_engine_server.key_a,
        json={"tokens": [5] * CONTEXT},
    )
    assert ok.status_code == 200, ok.text
    over = http(
        live_engine_server,
        "POST",
        "/detokenize",
        key=live_engine_server.key_a,
        json={"tokens": [5] * (CONTEXT + 1)},
    )
    assert over.status_code == 400, over.text
    error = over.json()["error"]
    assert error["param"] == "tokens" and f"max_model_len {CONTEXT}" in error["message"]


def test_a_text_within_the_bound_is_tokenized_and_counted(live_engine_server):
    before = tokenized_characters(live_engine_server)
    answer = http(
        live_engine_server,
        "POST",
        "/tokenize",
        key=live_engine_server.key_a,
        json={"prompt": "The quick brown fox"},
    )
    assert answer.status_code == 200, answer.text
    assert tokenized_characters(live_engine_server) == before + len("The quick brown fox")
    reply = http(
        live_engine_server,
        "POST",
        "/v1/chat/completions",
        key=live_engine_server.key_a,
        json={"model": BASE_NAME, "messages": USER, "max_tokens": 1},
    )
    assert reply.status_code == 200, reply.text
    assert tokenized_characters(live_engine_server) > before + len("The quick brown fox")


def test_the_server_logged_no_error(live_engine_server):
    assert "Traceback" not in live_engine_server.log.read_text()
