"""vLLM's /tokenize and /detokenize, and the `max_model_len` of GET /v1/models, over HTTP
against `manage.py serve`: the ids are those generation counts, the model is resolved in the
caller's tenant, and every bad input is a 400 naming its field."""

import pytest

from inference.openai import openapi_tokenize, serving_tokenize
from tests.clients import chat, http
from tests.inference.conftest import BASE_NAME

# The server reads rows committed by the module's fixtures; tests change them only over HTTP.
pytestmark = pytest.mark.django_db
QUESTION = [{"role": "user", "content": "Say something."}]
PROMPT = "The quick brown fox"


def tokenize(server, key=None, **body):
    return http(server, "POST", "/tokenize", key=key or server.key_a, json=body)


def detokenize(server, key=None, **body):
    return http(server, "POST", "/detokenize", key=key or server.key_a, json=body)


def completion_usage(server, prompt) -> dict:
    body = {"model": BASE_NAME, "prompt": prompt, "max_tokens": 1}
    answer = http(server, "POST", "/v1/completions", key=server.key_a, json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()["usage"]


def test_a_prompt_is_counted_as_completions_count_it(live_engine_server):
    answer = tokenize(live_engine_server, model=BASE_NAME, prompt=PROMPT)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (
        body["count"]
        == len(body["tokens"])
        == completion_usage(live_engine_server, PROMPT)["prompt_tokens"]
    )
    assert body["token_strs"] is None
    assert isinstance(body["max_model_len"], int) and body["max_model_len"] > body["count"]
    back = detokenize(live_engine_server, model=BASE_NAME, tokens=body["tokens"])
    assert back.status_code == 200, back.text
    assert back.json() == {"prompt": PROMPT}


def test_a_conversation_is_counted_as_chat_counts_it(live_engine_server):
    answer = tokenize(live_engine_server, model="pirate", messages=QUESTION)
    assert answer.status_code == 200, answer.text
    reply = chat(live_engine_server, live_engine_server.key_a, model="pirate", messages=QUESTION)
    assert answer.json()["count"] == reply.json()["usage"]["prompt_tokens"]
    bare = tokenize(
        live_engine_server, model="pirate", messages=QUESTION, add_generation_prompt=False
    )
    assert bare.status_code == 200, bare.text
    # without the assistant's turn opened, the ids are a strict prefix
    assert answer.json()["tokens"][: bare.json()["count"]] == bare.json()["tokens"]
    assert bare.json()["count"] < answer.json()["count"]


def test_token_strings_come_when_asked(live_engine_server):
    body = tokenize(live_engine_server, prompt=PROMPT, return_token_strs=True).json()
    strs = body["token_strs"]
    assert len(strs) == body["count"] and all(isinstance(s, str) and s for s in strs)


def test_without_a_model_the_replicas_base_model_tokenizes(live_engine_server):
    named = tokenize(live_engine_server, model=BASE_NAME, prompt=PROMPT).json()
    assert tokenize(live_engine_server, prompt=PROMPT).json() == named
    assert tokenize(live_engine_server, model="pirate@production", prompt=PROMPT).json() == named
    assert detokenize(live_engine_server, tokens=named["tokens"]).json() == {"prompt": PROMPT}


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize"])
def test_a_model_of_another_tenant_is_as_unknown_as_a_missing_one(live_engine_server, path):
    body = {"prompt": PROMPT} if path == "/tokenize" else {"tokens": [1, 2]}
    for key, model in (
        (live_engine_server.key_b, "pirate"),  # tenant A's adapter, asked by tenant B
        (live_engine_server.key_a, "no-such-model"),
    ):
        answer = http(live_engine_server, "POST", path, key=key, json={**body, "model": model})
        assert answer.status_code == 404, answer.text
        error = answer.json()["error"]
        assert error["code"] == "model_not_found" and error["param"] == "model"
        assert model in error["message"]


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize"])
def test_the_key_is_checked_like_generations(live_engine_server, path):
    body = {"prompt": PROMPT} if path == "/tokenize" else {"tokens": [1]}
    assert http(live_engine_server, "POST", path, json=body).status_code == 401
    no_scope = http(
        live_engine_server, "POST", path, key=live_engine_server.key_a_no_inference, json=body
    )
    assert no_scope.status_code == 403, no_scope.text
    wrong_method = http(live_engine_server, "GET", path, key=live_engine_server.key_a)
    assert wrong_method.status_code == 405 and wrong_method.headers["Allow"] == "POST"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "prompt"),
        ({"prompt": PROMPT, "messages": QUESTION}, "prompt"),
        ({"prompt": 5}, "prompt"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
        ({"prompt": PROMPT, "model": ""}, "model"),
        ({"prompt": PROMPT, "model": 7}, "model"),
        ({"prompt": PROMPT, "add_special_tokens": "yes"}, "add_special_tokens"),
        ({"prompt": PROMPT, "add_generation_prompt": True}, "add_generation_prompt"),
        ({"messages": QUESTION, "add_generation_prompt": 1}, "add_generation_prompt"),
        ({"prompt": PROMPT, "return_token_strs": 1}, "return_token_strs"),
        ({"prompt": PROMPT, "temperature": 0}, "temperature"),
    ],
)
def test_a_bad_tokenize_body_is_a_400_naming_the_field(live_engine_server, body, param):
    answer = tokenize(live_engine_server, **body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and error["message"], error


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "tokens"),
        ({"tokens": "1 2 3"}, "tokens"),
        ({"tokens": [1, -1]}, "tokens"),
        ({"tokens": [1.5]}, "tokens"),
        ({"tokens": [True]}, "tokens"),
        ({"tokens": [10**9]}, "tokens"),  # outside the vocabulary
        ({"tokens": [1], "model": ""}, "model"),
        ({"tokens": [1], "prompt": "x"}, "prompt"),
    ],
)
def test_a_bad_detokenize_body_is_a_400_naming_the_field(live_engine_server, body, param):
    answer = detokenize(live_engine_server, **body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and error["message"], error


def test_a_body_that_is_not_json_is_a_400(live_engine_server):
    answer = http(
        live_engine_server,
        "POST",
        "/tokenize",
        key=live_engine_server.key_a,
        content=b"{not json",
        headers={"Content-Type": "application/json"},
    )
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_json"


def test_the_model_list_gives_each_models_context(live_engine_server):
    context = tokenize(live_engine_server, prompt=PROMPT).json()["max_model_len"]
    listed = {m.id: m for m in live_engine_server.openai().models.list().data}
    for name in (BASE_NAME, "pirate", "pirate@production"):
        assert listed[name].model_extra["max_model_len"] == context, name
    one = http(live_engine_server, "GET", "/v1/models/pirate", key=live_engine_server.key_a)
    assert one.json()["max_model_len"] == context


@pytest.mark.parametrize(
    ("schema", "fields"),
    [
        ("TokenizeRequest", serving_tokenize.TOKENIZE_FIELDS),
        ("DetokenizeRequest", serving_tokenize.DETOKENIZE_FIELDS),
    ],
)
def test_the_openapi_description_names_exactly_the_parsers_fields(schema, fields):
    described = openapi_tokenize.SCHEMAS[schema]
    assert set(described["properties"]) == fields
    assert described["additionalProperties"] is False
