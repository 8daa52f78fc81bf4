"""Our answers hold against OpenAI's own published schema (schema.py, its source named in
openai_schema/): chat completions and their stream chunks, completions, the model list and
one model, and every error, over HTTP against a live `manage.py serve`.

Before: chat messages and chat logprobs lacked the required `refusal`, most error bodies
lacked `param` (required, null allowed), completions' `text_offset` was empty while `tokens`
was not, `GET /v1/models/{model}` did not exist, and unknown paths, a wrong method on the
health probe and Django's own refusals were HTML pages.
"""

import json

import pytest

from tests.clients import chat, http, sse_events
from tests.inference.conftest import BASE_NAME
from tests.inference.openai.schema import assert_fits, schema_problems
from tests.raw_http import connect, head, read_answer

pytestmark = pytest.mark.django_db  # the server reads rows committed by serve_data
QUESTION = [{"role": "user", "content": "Say something."}]
# Short greedy answers of tenant A's, on the base model.
GREEDY = {"model": BASE_NAME, "messages": QUESTION, "max_tokens": 6, "temperature": 0}
REQUEST_LIMIT = 64 * 1024  # LORAPLEX_MAX_REQUEST_BYTES of the live server (conftest)


def test_the_check_itself_catches_what_was_wrong():
    """The schema is read right: the shapes this server used to answer fail it."""
    assert schema_problems("ErrorResponse", {"error": {"message": "m", "type": "t", "code": "c"}})
    message = {"role": "assistant", "content": "Hi"}  # no `refusal`
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}
    body = {"id": "x", "object": "chat.completion", "created": 1, "model": "m"}
    assert schema_problems("CreateChatCompletionResponse", {**body, "choices": [choice]})
    chunk = {**body, "object": "chat.completion.chunk"}
    ok = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": None}  # nullable: true
    assert not schema_problems("CreateChatCompletionStreamResponse", {**chunk, "choices": [ok]})


@pytest.mark.parametrize("logprobs", [{}, {"logprobs": True, "top_logprobs": 2}])
def test_a_chat_completion_fits_openais_schema(live_engine_server, logprobs):
    server = live_engine_server
    response = chat(server, server.key_a, **GREEDY, n=2, seed=7, **logprobs)
    assert response.status_code == 200, response.text
    body = response.json()
    assert_fits("CreateChatCompletionResponse", body)
    assert all(choice["message"]["refusal"] is None for choice in body["choices"])
    if logprobs:
        assert all(len(choice["logprobs"]["content"]) >= 1 for choice in body["choices"])


def test_every_chat_stream_chunk_fits_openais_schema(live_engine_server):
    response = chat(
        live_engine_server,
        live_engine_server.key_a,
        **GREEDY,
        stream=True,
        stream_options={"include_usage": True},
        logprobs=True,
        top_logprobs=1,
    )
    assert response.status_code == 200, response.text
    chunks = sse_events(response)
    for chunk in chunks:
        assert_fits("CreateChatCompletionStreamResponse", chunk)
    assert chunks[-1]["usage"]["completion_tokens"] >= 1 and chunks[-1]["choices"] == []
    assert any(c["choices"] and c["choices"][0]["logprobs"] for c in chunks)


def test_a_completion_with_logprobs_fits_openais_schema_and_places_each_token(live_engine_server):
    body = {"model": "pirate", "prompt": "Once upon", "max_tokens": 8, "temperature": 0}
    body |= {"logprobs": 2, "ignore_eos": True}
    whole = http(
        live_engine_server, "POST", "/v1/completions", key=live_engine_server.key_a, json=body
    )
    assert whole.status_code == 200, whole.text
    assert_fits("CreateCompletionResponse", whole.json())
    logprobs = whole.json()["choices"][0]["logprobs"]
    offsets, tokens = logprobs["text_offset"], logprobs["tokens"]
    assert len(offsets) == len(tokens) == 8  # before: text_offset was []
    assert offsets[0] == 0 and offsets == sorted(offsets)
    # a stream places each token where the whole answer does
    streamed = http(
        live_engine_server,
        "POST",
        "/v1/completions",
        key=live_engine_server.key_a,
        json={**body, "stream": True},
    )
    chunks = [c for c in sse_events(streamed) if c["choices"]]
    assert [o for c in chunks for o in c["choices"][0]["logprobs"]["text_offset"]] == offsets


def test_the_model_list_and_each_model_fit_openais_schema(live_engine_server):
    server = live_engine_server
    listed = http(server, "GET", "/v1/models", key=server.key_a)
    assert_fits("ListModelsResponse", listed.json())
    ids = [model["id"] for model in listed.json()["data"]]
    assert {BASE_NAME, "pirate", "pirate@production"} <= set(ids)
    for model in listed.json()["data"]:
        one = http(server, "GET", f"/v1/models/{model['id']}", key=server.key_a)
        assert one.status_code == 200, one.text
        assert_fits("Model", one.json())
        assert one.json() == model
    # the official client's call
    assert server.openai().models.retrieve("pirate@production").owned_by == "serve-a"


def test_a_model_the_tenant_cannot_use_is_a_json_404_like_a_missing_one(live_engine_server):
    server = live_engine_server
    answers = [
        http(server, "GET", f"/v1/models/{name}", key=server.key_b)
        for name in ("pirate", "no-such-model")
    ]
    for answer in answers:
        assert answer.status_code == 404
        assert_fits("ErrorResponse", answer.json())
        assert answer.json()["error"]["code"] == "model_not_found"
        assert answer.json()["error"]["param"] == "model"
    first, second = (a.json()["error"]["message"] for a in answers)
    assert first.replace("pirate", "X") == second.replace("no-such-model", "X")


GENERATION = {"model": BASE_NAME, "messages": QUESTION, "max_tokens": 2}


@pytest.mark.parametrize(
    "method, path, key, send, status, code, param",
    [
        ("POST", "/v1/chat/completions", None, {"json": GENERATION}, 401, "missing_api_key", None),
        ("POST", "/v1/completions", "sk-wrong", {"json": {}}, 401, "invalid_api_key", None),
        (
            "GET",
            "/api/v1/adapters/",
            None,
            {"headers": {"Authorization": "Basic eDp5"}},
            401,
            "malformed_authorization",
            None,
        ),
        ("GET", "/v1/models", "lp_nope_nope", {}, 401, "invalid_api_key", None),
        ("GET", "/v1/models/pirate", None, {}, 401, "missing_api_key", None),
        ("POST", "/v1/chat/completions", "a", {"content": b"{nope"}, 400, "invalid_json", None),
        ("GET", "/v1/chat/completions", "a", {}, 405, "method_not_allowed", None),
        ("DELETE", "/v1/models/pirate", "a", {}, 405, "method_not_allowed", None),
        ("GET", "/v1/lora_adapters", "a", {}, 403, "operator_only", None),
        ("GET", "/v1/no-such-endpoint", "a", {}, 404, "unknown_path", None),
        (
            "POST",
            "/v1/chat/completions/extra",
            "a",
            {"json": GENERATION},
            404,
            "unknown_path",
            None,
        ),
        ("GET", "/v1", None, {}, 404, "unknown_path", None),
        ("GET", "/api/v1/adapters/", None, {}, 401, "missing_api_key", None),
        ("GET", "/api/v1/adapters/no-such-adapter/", "a", {}, 404, "not_found", None),
        ("GET", "/api/v1/no-such-collection/", "a", {}, 404, "unknown_path", None),
        ("GET", "/api/nothing", None, {}, 404, "unknown_path", None),
        (
            "GET",
            "/api/v1/adapters/x/",
            "a",
            {"headers": {"Accept": "text/html"}},
            404,
            "not_found",
            None,
        ),
        ("POST", "/api/schema/", None, {}, 405, "method_not_allowed", None),
        ("POST", "/healthz", None, {"content": b"x"}, 405, "method_not_allowed", None),
        (
            "POST",
            "/v1/chat/completions",
            "a",
            {"json": {**GENERATION, "seed": 2**64}},  # before: torch's overflow, a 500
            400,
            "invalid_request",
            "seed",
        ),
    ],
)
def test_every_error_is_json_in_openais_shape(
    live_engine_server, method, path, key, send, status, code, param
):
    server = live_engine_server
    response = http(server, method, path, key=server.key_a if key == "a" else key, **send)
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json", response.text
    assert_fits("ErrorResponse", response.json())
    assert (response.json()["error"]["code"], response.json()["error"]["param"]) == (code, param)


def test_a_chunked_body_over_the_limit_is_a_json_413(live_engine_server):
    """A chunked body has no Content-Length to refuse up front: it is cut as it arrives."""
    chunk = b" " * 16384
    with connect(live_engine_server.url) as sock:
        sock.sendall(
            head(
                "POST",
                "/v1/chat/completions",
                {
                    "Transfer-Encoding": "chunked",
                    "Content-Type": "application/json",
                    "Authorization": f"Bearer {live_engine_server.key_a}",
                },
            )
        )
        try:
            for _ in range(2 * REQUEST_LIMIT // len(chunk)):
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            sock.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed: the answer is read below
        status, headers, body = read_answer(sock)
    assert status == 413 and headers["content-type"] == "application/json"
    assert_fits("ErrorResponse", json.loads(body))
    assert json.loads(body)["error"]["code"] == "request_too_large"
