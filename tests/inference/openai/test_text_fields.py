"""A string no tokenizer can take (a lone UTF-16 surrogate, which JSON can spell as "\\ud800")
is a 400 naming the field by its path in the body, on every endpoint and in every field;
before, in a prompt it reached the tokenizer and answered 500. Over HTTP against a live
`manage.py serve`, and the reading of a body on its own."""

import json

import httpx
import pytest

from inference.errors import ProtocolError
from inference.openai.protocol import load_json
from inference.openai.text_fields import refuse_invalid_text
from tests.clients import TIMEOUT, http, metric
from tests.inference.conftest import BASE_NAME

pytestmark = pytest.mark.django_db
LONE = "\ud800"
USER = [{"role": "user", "content": "Hi"}]


def post_raw(server, path: str, body: dict, key: str | None = None) -> httpx.Response:
    """`body` as JSON with every non-ASCII character escaped, as `json.dumps` writes it: the
    only way a lone surrogate travels (UTF-8 cannot carry one; httpx's `json=` would fail)."""
    return httpx.post(
        f"{server.url}{path}",
        content=json.dumps(body).encode("ascii"),
        headers={"Authorization": f"Bearer {key or server.key_a}"},
        timeout=TIMEOUT,
    )


CASES = [
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": LONE}]},
        "messages[0].content",
    ),
    (
        "/v1/chat/completions",
        {
            "messages": [
                *USER,
                {"role": "assistant", "content": "a"},
                {"role": "user", "content": "x" + LONE},
            ]
        },
        "messages[2].content",
    ),
    ("/v1/chat/completions", {"messages": USER, "stop": ["ok", LONE]}, "stop[1]"),
    (
        "/v1/chat/completions",
        {
            "messages": USER,
            "tools": [{"type": "function", "function": {"name": "f", "description": LONE}}],
        },
        "tools[0].function.description",
    ),
    ("/v1/completions", {"prompt": LONE}, "prompt"),
    ("/v1/completions", {"prompt": ["fine", "bad " + LONE]}, "prompt[1]"),
    ("/v1/completions", {"prompt": "Hi", "user": LONE}, "user"),
    ("/v1/responses", {"input": LONE}, "input"),
    (
        "/v1/responses",
        {
            "input": [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello"},
                {"role": "user", "content": [{"type": "input_text", "text": "\udfff"}]},
            ]
        },
        "input[2].content[0].text",
    ),
    ("/v1/responses", {"input": "Hi", "instructions": LONE}, "instructions"),
    ("/v1/responses", {"input": "Hi", "metadata": {"k": LONE}}, "metadata.k"),
    ("/tokenize", {"prompt": LONE}, "prompt"),
    ("/tokenize", {"messages": [{"role": "user", "content": LONE}]}, "messages[0].content"),
    ("/detokenize", {"tokens": [1], "model": LONE}, "model"),
]


@pytest.mark.parametrize(("path", "body", "param"), CASES)
def test_a_lone_surrogate_is_a_400_naming_its_field(live_engine_server, path, body, param):
    before = metric(live_engine_server, "loraplex_tokenized_characters_total")
    answer = post_raw(live_engine_server, path, {"model": BASE_NAME, **body})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_request" and error["param"] == param, error
    assert "unpaired UTF-16 surrogate" in error["message"]
    # refused where the body is read: nothing of it was tokenized
    assert metric(live_engine_server, "loraplex_tokenized_characters_total") == before


def test_a_surrogate_in_the_model_name_or_a_key_is_named_too(live_engine_server):
    answer = post_raw(live_engine_server, "/v1/chat/completions", {"model": LONE, "messages": USER})
    assert (answer.status_code, answer.json()["error"]["param"]) == (400, "model")
    key = post_raw(
        live_engine_server, "/v1/chat/completions", {"model": BASE_NAME, "messages": USER, LONE: 1}
    )
    assert key.status_code == 400, key.text
    assert key.json()["error"]["param"] == "\\ud800"  # the key, escaped so the answer is text


def test_a_surrogate_pair_is_one_character_and_served(live_engine_server):
    """Escaped as a pair (what `json.dumps` writes for an emoji), it is valid text."""
    answer = post_raw(
        live_engine_server,
        "/v1/chat/completions",
        {
            "model": BASE_NAME,
            "messages": [{"role": "user", "content": "Hi \U0001f600"}],
            "max_tokens": 1,
        },
    )
    assert answer.status_code == 200, answer.text
    tokenized = post_raw(live_engine_server, "/tokenize", {"prompt": "\U0001f600"})
    assert tokenized.status_code == 200, tokenized.text
    back = http(
        live_engine_server,
        "POST",
        "/detokenize",
        key=live_engine_server.key_a,
        json={"tokens": tokenized.json()["tokens"]},
    )
    assert back.json() == {"prompt": "\U0001f600"}


def test_the_body_reader_names_the_first_bad_string_in_document_order():
    body = {"a": ["ok", {"b": LONE}], "c": LONE}
    with pytest.raises(ProtocolError) as raised:
        refuse_invalid_text(body)
    assert raised.value.param == "a[1].b"
    assert "at character 0" in raised.value.message
    with pytest.raises(ProtocolError) as at:
        refuse_invalid_text({"text": "abc\udc00"})
    assert "U+DC00" in at.value.message and "at character 3" in at.value.message


def test_the_body_reader_walks_any_depth_without_recursion():
    deep: list = ["\ud800"]
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(ProtocolError) as raised:
        refuse_invalid_text({"x": deep})
    assert raised.value.param == "x" + "[0]" * 5001


def test_valid_text_of_every_plane_passes_the_body_reader():
    text = "ascii é 中文 \U0001f600 \ufffd \uffff \x00"
    assert load_json(json.dumps({"prompt": text, "ids": list(range(100))}).encode()) == {
        "prompt": text,
        "ids": list(range(100)),
    }
