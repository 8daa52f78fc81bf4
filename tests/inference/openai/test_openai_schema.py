"""Our answers hold against OpenAI's own published schema (tests/inference/openai_schema/, its
source named there): chat completions and their stream chunks, completions, the model list
and one model, and every error, over HTTP against a live `manage.py serve`.

Before: chat messages and chat logprobs lacked the required `refusal`, most error bodies
lacked `param` (required, null allowed), completions' `text_offset` was empty while `tokens`
was not, `GET /v1/models/{model}` did not exist, and unknown paths, a wrong method on the
health probe and Django's own refusals were HTML pages.
"""

import json
from functools import cache
from pathlib import Path

import httpx
import pytest
import yaml
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]

from tests.inference.conftest import BASE_NAME
from tests.inference.test_bodies import connect, head, read_answer

pytestmark = pytest.mark.django_db  # the server reads rows committed by serve_data
SCHEMA_FILE = Path(__file__).parent / "openai_schema" / "openai_components.yaml"
QUESTION = [{"role": "user", "content": "Say something."}]
REQUEST_LIMIT = 64 * 1024  # LORAPLEX_MAX_REQUEST_BYTES of the live server (conftest)


def _json_schema(node):
    """OpenAI's OpenAPI 3.1 document still marks some fields the 3.0 way, `nullable: true`,
    which JSON Schema ignores: say it in JSON Schema's words (null, or the schema)."""
    if isinstance(node, list):
        return [_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: _json_schema(value) for key, value in node.items()}
    if node.get("nullable") is True:
        del node["nullable"]
        return {"anyOf": [node, {"type": "null"}]}
    return node


@cache
def _document() -> dict:
    return _json_schema(yaml.safe_load(SCHEMA_FILE.read_text()))


def schema_problems(name: str, instance) -> list[str]:
    """Where `instance` breaks OpenAI's schema `name` (components/schemas), one line each."""
    validator = Draft202012Validator({**_document(), "$ref": f"#/components/schemas/{name}"})
    return [
        f"{'/'.join(map(str, error.absolute_path)) or '(top)'}: {error.message}"
        for error in sorted(validator.iter_errors(instance), key=str)
    ]


def assert_fits(name: str, instance) -> None:
    problems = schema_problems(name, instance)
    assert not problems, f"{name}:\n" + "\n".join(problems) + f"\n{json.dumps(instance)[:2000]}"


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


def v1(server, method: str, path: str, *, key=None, **kwargs) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.request(
        method, f"{server.url}{path}", headers=headers | kwargs.pop("headers", {}), **kwargs
    )


def chat(server, **fields) -> httpx.Response:
    body = {"model": BASE_NAME, "messages": QUESTION, "max_tokens": 6, "temperature": 0, **fields}
    return v1(server, "POST", "/v1/chat/completions", key=server.key_a, json=body, timeout=60)


def sse_events(response: httpx.Response) -> list[dict]:
    lines = [line for line in response.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]


@pytest.mark.parametrize("logprobs", [{}, {"logprobs": True, "top_logprobs": 2}])
def test_a_chat_completion_fits_openais_schema(live_engine_server, logprobs):
    response = chat(live_engine_server, n=2, seed=7, **logprobs)
    assert response.status_code == 200, response.text
    body = response.json()
    assert_fits("CreateChatCompletionResponse", body)
    assert all(choice["message"]["refusal"] is None for choice in body["choices"])
    if logprobs:
        assert all(len(choice["logprobs"]["content"]) >= 1 for choice in body["choices"])


def test_every_chat_stream_chunk_fits_openais_schema(live_engine_server):
    response = chat(
        live_engine_server,
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
    whole = v1(
        live_engine_server, "POST", "/v1/completions", key=live_engine_server.key_a, json=body
    )
    assert whole.status_code == 200, whole.text
    assert_fits("CreateCompletionResponse", whole.json())
    logprobs = whole.json()["choices"][0]["logprobs"]
    offsets, tokens = logprobs["text_offset"], logprobs["tokens"]
    assert len(offsets) == len(tokens) == 8  # before: text_offset was []
    assert offsets[0] == 0 and offsets == sorted(offsets)
    # a stream places each token where the whole answer does
    streamed = v1(
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
    listed = v1(server, "GET", "/v1/models", key=server.key_a)
    assert_fits("ListModelsResponse", listed.json())
    ids = [model["id"] for model in listed.json()["data"]]
    assert {BASE_NAME, "pirate", "pirate@production"} <= set(ids)
    for model in listed.json()["data"]:
        one = v1(server, "GET", f"/v1/models/{model['id']}", key=server.key_a)
        assert one.status_code == 200, one.text
        assert_fits("Model", one.json())
        assert one.json() == model
    # the official client's call
    assert server.openai().models.retrieve("pirate@production").owned_by == "serve-a"


def test_a_model_the_tenant_cannot_use_is_a_json_404_like_a_missing_one(live_engine_server):
    server = live_engine_server
    answers = [
        v1(server, "GET", f"/v1/models/{name}", key=server.key_b)
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
    response = v1(server, method, path, key=server.key_a if key == "a" else key, **send)
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
