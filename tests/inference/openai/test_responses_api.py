"""POST /v1/responses over HTTP (raw and through the official `openai` client) against a live
`manage.py serve` with the tiny model: a response is the chat answer of the same
conversation (greedy, token for token), its stream says the same in OpenAI's events, a
stored response continues by `previous_response_id` for its own tenant only, and every
body this server cannot honour is a 400 naming the field, before the engine.
"""

import json

import jsonschema  # type: ignore[import-untyped]
import pytest

from tenants.models import UsageRecord
from tests.clients import chat, http, refusal
from tests.engine.structured_output_schemas import ENUMS, NESTED
from tests.inference.conftest import BASE_NAME
from tests.inference.openai.responses_calls import (
    EVENT_SCHEMAS,
    create,
    created,
    output_text,
    stream_events,
)
from tests.inference.openai.schema import assert_fits, schema_problems
from tests.processes import committed
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db  # the server reads rows committed by serve_data
QUESTION = "Say something."
GREEDY = {"model": BASE_NAME, "temperature": 0, "max_output_tokens": 16}  # OpenAI: >= 16
MISSING = "resp_" + "0" * 32


def chat_answer(server, messages, max_tokens=16, model=BASE_NAME) -> dict:
    answer = chat(
        server, server.key_a, model=model, messages=messages, max_tokens=max_tokens, temperature=0
    )
    assert answer.status_code == 200, answer.text
    return answer.json()


def assert_same_answer(response: dict, completion: dict) -> None:
    """The response says what the chat completion of the same conversation says."""
    choice = completion["choices"][0]
    assert output_text(response) == choice["message"]["content"]
    usage = response["usage"]
    assert usage["input_tokens"] == completion["usage"]["prompt_tokens"]
    assert usage["output_tokens"] == completion["usage"]["completion_tokens"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    if choice["finish_reason"] == "length":
        assert response["status"] == "incomplete"
        assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    else:
        assert response["status"] == "completed" and response["incomplete_details"] is None


def test_the_check_itself_catches_what_would_be_wrong():
    """The Responses schemas are read right: a response without its required `tools`, or an
    event without its `sequence_number`, fails them."""
    body = {"id": "resp_1", "object": "response", "created_at": 1, "model": "m", "output": []}
    body |= {"error": None, "incomplete_details": None, "instructions": None}
    body |= {"parallel_tool_calls": True, "metadata": {}, "tool_choice": "auto"}
    body |= {"temperature": 1.0, "top_p": 1.0}
    assert schema_problems("Response", body)
    assert not schema_problems("Response", {**body, "tools": []})
    delta = {"type": "response.output_text.delta", "item_id": "m", "output_index": 0}
    delta |= {"content_index": 0, "delta": "x", "logprobs": []}
    assert schema_problems("ResponseTextDeltaEvent", delta)
    assert not schema_problems("ResponseTextDeltaEvent", {**delta, "sequence_number": 0})


@pytest.mark.parametrize("model", [BASE_NAME, "pirate"])
def test_a_text_input_is_answered_as_the_chat_api_answers_it(live_engine_server, model):
    body = {**GREEDY, "model": model, "input": QUESTION}
    response = created(live_engine_server, **body)
    assert_fits("CreateResponse", body)
    assert_fits("Response", response)
    assert response["id"].startswith("resp_") and response["object"] == "response"
    assert response["model"] == model and response["store"] is True
    (message,) = response["output"]
    assert message["type"] == "message" and message["role"] == "assistant"
    assert message["id"].startswith("msg_")
    expected = chat_answer(live_engine_server, [{"role": "user", "content": QUESTION}], model=model)
    assert_same_answer(response, expected)


def test_message_items_and_instructions_are_the_conversation(live_engine_server):
    """Every way to write a message reaches the template as the chat message it means, the
    instructions first, as a system message; the official client reads the answer."""
    items = [
        {"role": "developer", "content": "Answer briefly."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Hello."}]},
        {"role": "user", "content": "More?"},
    ]
    client = live_engine_server.openai()
    response = client.responses.create(
        model=BASE_NAME,
        input=items,
        instructions="You are a pirate.",
        temperature=0,
        max_output_tokens=16,
    )
    messages = [
        {"role": "system", "content": "You are a pirate."},
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "More?"},
    ]
    assert_same_answer(response.model_dump(), chat_answer(live_engine_server, messages))
    assert response.instructions == "You are a pirate."
    assert response.output_text == output_text(response.model_dump())


def test_a_stream_tells_the_same_answer_in_openais_events(live_engine_server):
    body = {**GREEDY, "max_output_tokens": 12, "input": QUESTION}
    whole = created(live_engine_server, **body)
    streamed = create(live_engine_server, **body, stream=True)
    assert streamed.status_code == 200 and streamed.headers["content-type"].startswith(
        "text/event-stream"
    )
    events = stream_events(streamed)
    for event in events:
        assert_fits(EVENT_SCHEMAS[event["type"]], event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events]
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * len(deltas),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed" if whole["status"] == "completed" else "response.incomplete",
    ]
    assert len(deltas) > 1  # the text streams as it is generated
    final = events[-1]["response"]
    done = next(e for e in events if e["type"] == "response.output_text.done")
    assert "".join(deltas) == done["text"] == output_text(final) == output_text(whole)
    assert (
        events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    )
    assert final["id"] == events[0]["response"]["id"] != whole["id"]
    assert final["usage"] == whole["usage"]
    item = events[-2]["item"]
    assert item == final["output"][0] and item["status"] == final["output"][0]["status"]
    # stored before the client learned it was done: continuing from it works at once
    stored = http(
        live_engine_server, "GET", f"/v1/responses/{final['id']}", key=live_engine_server.key_a
    )
    assert stored.json() == final
    # the official client's stream helper checks the events' order and ids as it reads them
    client = live_engine_server.openai()
    with client.responses.stream(input=QUESTION, **{**GREEDY, "max_output_tokens": 12}) as stream:
        sdk_events = list(stream)
    assert [e.type for e in sdk_events] == kinds
    # (its get_final_response() wants response.completed, and this one may be incomplete)
    assert sdk_events[-1].response.output_text == output_text(whole)


def test_previous_response_id_continues_the_stored_conversation(live_engine_server):
    """The stored input and output come before the new input; the first instructions do not
    carry over (OpenAI's rule)."""
    server = live_engine_server
    first = created(server, **GREEDY, input="Hi", instructions="Be a pirate.")
    second = created(server, **GREEDY, input="And then?", previous_response_id=first["id"])
    assert second["previous_response_id"] == first["id"]
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": output_text(first)},
        {"role": "user", "content": "And then?"},
    ]
    assert_same_answer(second, chat_answer(server, messages))
    third = created(server, **GREEDY, input="Why?", previous_response_id=second["id"])
    messages += [
        {"role": "assistant", "content": output_text(second)},
        {"role": "user", "content": "Why?"},
    ]
    assert_same_answer(third, chat_answer(server, messages))
    # read back as it was answered, by the official client too
    assert http(server, "GET", f"/v1/responses/{first['id']}", key=server.key_a).json() == first
    assert server.openai().responses.retrieve(second["id"]).output_text == output_text(second)


def test_a_response_is_metered_as_one_usage_record(live_engine_server):
    response = created(live_engine_server, **GREEDY, input="Count me.", metadata={"m": "1"})
    record = wait_for(
        lambda: committed(
            lambda: (
                UsageRecord.objects.filter(tenant__slug="serve-a", endpoint="responses")
                .filter(prompt_tokens=response["usage"]["input_tokens"])
                .filter(completion_tokens=response["usage"]["output_tokens"])
                .first()
            )
        ),
        what="the response's usage record",
    )
    assert record.model == BASE_NAME and record.status == UsageRecord.OK


def test_store_false_keeps_nothing(live_engine_server):
    server = live_engine_server
    response = created(server, **GREEDY, input="Hi", store=False)
    assert response["store"] is False
    assert_not_found(http(server, "GET", f"/v1/responses/{response['id']}", key=server.key_a))
    assert_not_found(http(server, "DELETE", f"/v1/responses/{response['id']}", key=server.key_a))
    later = create(server, **GREEDY, input="Again", previous_response_id=response["id"])
    assert_not_found(later, param="previous_response_id")


def assert_not_found(answer, param=None) -> str:
    assert answer.status_code == 404, answer.text
    assert_fits("ErrorResponse", answer.json())
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == ("not_found", param)
    return error["message"]


def test_another_tenants_response_is_not_found_like_a_missing_one(live_engine_server):
    server = live_engine_server
    mine = created(server, **GREEDY, input="A secret.")
    path = f"/v1/responses/{mine['id']}"
    for method in ("GET", "DELETE"):
        foreign = assert_not_found(http(server, method, path, key=server.key_b))
        missing = assert_not_found(
            http(server, method, f"/v1/responses/{MISSING}", key=server.key_b)
        )
        assert foreign.replace(mine["id"], "X") == missing.replace(MISSING, "X")
    continued = create(
        server, server.key_b, **GREEDY, input="What was it?", previous_response_id=mine["id"]
    )
    assert_not_found(continued, param="previous_response_id")
    # still the owner's, until the owner deletes it
    assert http(server, "GET", path, key=server.key_a).json() == mine
    deleted = http(server, "DELETE", path, key=server.key_a)
    assert deleted.status_code == 200
    assert deleted.json() == {"id": mine["id"], "object": "response", "deleted": True}
    assert_not_found(http(server, "GET", path, key=server.key_a))
    assert_not_found(http(server, "DELETE", path, key=server.key_a))


@pytest.mark.parametrize("schema", [NESTED, ENUMS])
def test_a_json_schema_format_holds_the_answer_to_it(live_engine_server, schema):
    fmt = {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}
    body = {
        **GREEDY,
        "max_output_tokens": 80,
        "input": "Describe a person.",
        "text": {"format": fmt},
    }
    response = created(live_engine_server, **body)
    assert response["status"] == "completed" and response["text"]["format"] == fmt
    jsonschema.validate(json.loads(output_text(response)), schema)
    assert_fits("CreateResponse", body)
    assert_fits("Response", response)


def test_a_json_object_format_answers_an_object(live_engine_server):
    body = {**GREEDY, "max_output_tokens": 80, "input": "A JSON object:"}
    response = created(live_engine_server, **body, text={"format": {"type": "json_object"}})
    if response["status"] == "completed":  # greedy strings may run past the budget
        assert isinstance(json.loads(output_text(response)), dict)
    assert output_text(response).startswith("{")


def test_methods_and_paths_are_refused_as_json(live_engine_server):
    server = live_engine_server
    wrong = http(server, "GET", "/v1/responses", key=server.key_a)
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    put = http(server, "PUT", f"/v1/responses/{MISSING}", key=server.key_a)
    assert put.status_code == 405 and put.headers["allow"] == "GET, DELETE"
    assert http(server, "GET", f"/v1/responses/{MISSING}").status_code == 401
    no_scope = http(server, "GET", f"/v1/responses/{MISSING}", key=server.key_a_no_inference)
    assert no_scope.status_code == 403
    odd = http(server, "GET", "/v1/responses/resp_%00nul", key=server.key_a)
    assert_not_found(odd)


FUNCTION = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}
SCHEMA_FORMAT = {"type": "json_schema", "name": "a", "schema": {"type": "object"}}


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"model": None}, "model", "invalid_request"),
        ({"input": None}, "input", "invalid_request"),
        ({"input": " "}, "input", "invalid_request"),
        ({"input": []}, "input", "invalid_request"),
        ({"input": [5]}, "input[0]", "invalid_request"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role", "invalid_request"),
        ({"input": [{"role": "user", "content": ""}]}, "input[0].content", "invalid_request"),
        ({"input": [{"role": "user", "content": 5}]}, "input[0].content", "invalid_request"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0].type",
            "unsupported_parameter",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_text", "text": 1}]}]},
            "input[0].content[0].text",
            "invalid_request",
        ),
        ({"input": [{"role": "user", "content": "x", "x": 1}]}, "input[0]", "invalid_request"),
        (
            {"input": [{"type": "item_reference", "id": "x"}]},
            "input[0].type",
            "unsupported_parameter",
        ),
        ({"input": [{"type": "web_search_call"}]}, "input[0].type", "unsupported_parameter"),
        ({"input": [{"type": {}}]}, "input[0].type", "unsupported_parameter"),
        (
            {"input": [{"role": "user", "content": [{"type": {}, "text": "x"}]}]},
            "input[0].content[0].type",
            "unsupported_parameter",
        ),
        (
            {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "no"}]},
            "input[0].arguments",
            "invalid_request",
        ),
        (
            {"input": [{"type": "function_call", "call_id": "", "name": "f", "arguments": "{}"}]},
            "input[0].call_id",
            "invalid_request",
        ),
        (
            {"input": ["Hi", {"type": "function_call_output", "call_id": "c", "output": "1"}]},
            "input[0]",
            "invalid_request",
        ),
        (
            {
                "input": [
                    {"role": "user", "content": "Hi"},
                    {"type": "function_call_output", "call_id": "c", "output": "1"},
                ]
            },
            "input[1].call_id",
            "invalid_request",
        ),
        ({"instructions": 5}, "instructions", "invalid_request"),
        ({"max_output_tokens": 0}, "max_output_tokens", "invalid_request"),
        ({"max_output_tokens": "many"}, "max_output_tokens", "invalid_request"),
        ({"max_output_tokens": 10**6}, "max_output_tokens", "context_length_exceeded"),
        ({"input": "x " * 3000}, "input", "context_length_exceeded"),
        ({"temperature": 3}, "temperature", "invalid_request"),
        ({"top_p": 0}, "top_p", "invalid_request"),
        ({"stream": "yes"}, "stream", "invalid_request"),
        ({"stream_options": {"include_usage": True}}, "stream_options", "invalid_request"),
        ({"store": "no"}, "store", "invalid_request"),
        ({"metadata": {"k": 5}}, "metadata", "invalid_request"),
        ({"metadata": {str(i): "v" for i in range(17)}}, "metadata", "invalid_request"),
        ({"previous_response_id": 5}, "previous_response_id", "invalid_request"),
        ({"tools": [{"type": "web_search_preview"}]}, "tools[0].type", "unsupported_parameter"),
        (
            {"tools": [{"type": "mcp", "server_label": "x"}]},
            "tools[0].type",
            "unsupported_parameter",
        ),
        ({"tools": {"type": "function"}}, "tools", "invalid_request"),
        ({"tools": [{**FUNCTION, "name": "bad name"}]}, "tools[0].name", "invalid_request"),
        (
            {"tools": [{**FUNCTION, "parameters": {"type": "strnig"}}]},
            "tools[0].parameters",
            "invalid_request",
        ),
        (
            {"tools": [{**FUNCTION, "parameters": {"type": "array"}}]},
            "tools[0].parameters",
            "invalid_request",
        ),
        ({"tools": [FUNCTION, FUNCTION]}, "tools[1].name", "invalid_request"),
        (
            {"tools": [{**FUNCTION, "defer_loading": True}]},
            "tools[0].defer_loading",
            "unsupported_parameter",
        ),
        ({"tools": [{**FUNCTION, "color": "red"}]}, "tools[0]", "invalid_request"),
        ({"tools": [FUNCTION]}, "tools", "invalid_request"),  # this template shows no tools
        ({"tool_choice": "sometimes"}, "tool_choice", "invalid_request"),
        ({"tool_choice": "required"}, "tool_choice", "invalid_request"),  # without tools
        ({"tool_choice": {"type": "file_search"}}, "tool_choice", "unsupported_parameter"),
        (
            {"tools": [FUNCTION], "tool_choice": {"type": "function", "name": "g"}},
            "tool_choice",
            "invalid_request",
        ),
        ({"parallel_tool_calls": "no"}, "parallel_tool_calls", "invalid_request"),
        ({"text": "json"}, "text", "invalid_request"),
        ({"text": {"format": {"type": "yaml"}}}, "text.format.type", "invalid_request"),
        (
            {"text": {"format": {"type": "json_schema", "name": "a"}}},
            "text.format.schema",
            "invalid_request",
        ),
        (
            {"text": {"format": {**SCHEMA_FORMAT, "schema": {"type": "strnig"}}}},
            "text.format.schema",
            "invalid_request",
        ),
        (
            {"text": {"format": {**SCHEMA_FORMAT, "name": "a b"}}},
            "text.format.name",
            "invalid_request",
        ),
        ({"text": {"format": {**SCHEMA_FORMAT, "extra": 1}}}, "text.format", "invalid_request"),
        ({"text": {"verbosity": "high"}}, "text.verbosity", "unsupported_parameter"),
        (
            {"tools": [FUNCTION], "text": {"format": SCHEMA_FORMAT}},
            "text.format",
            "invalid_request",
        ),
        ({"background": True}, "background", "unsupported_parameter"),
        ({"reasoning": {"effort": "high"}}, "reasoning.effort", "unsupported_parameter"),
        ({"reasoning": {"summary": "auto"}}, "reasoning.summary", "unsupported_parameter"),
        ({"include": ["reasoning.encrypted_content"]}, "include", "unsupported_parameter"),
        ({"top_logprobs": 2}, "top_logprobs", "unsupported_parameter"),
        ({"truncation": "auto"}, "truncation", "unsupported_parameter"),
        ({"conversation": "conv_1"}, "conversation", "unsupported_parameter"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt", "unsupported_parameter"),
        ({"max_tool_calls": 2}, "max_tool_calls", "unsupported_parameter"),
        ({"frobnicate": 1}, "frobnicate", "unknown_parameter"),
    ],
)
def test_every_bad_input_is_a_400_naming_it(live_engine_server, fields, param, code):
    body = {"model": BASE_NAME, "input": "Hi", "max_output_tokens": 4, **fields}
    error = refusal(
        live_engine_server, "responses", {k: v for k, v in body.items() if v is not None}
    )
    assert (error["param"], error["code"]) == (param, code), error["message"]
    if code != "context_length_exceeded":  # "The prompt is 3000 tokens; ..."
        assert param.split("[")[0].split(".")[0] in error["message"], error["message"]


def test_neutral_settings_and_hints_are_accepted(live_engine_server):
    """What a client sends by default (the Agents SDK's `include: []`, say) or as hints."""
    neutral = {
        "background": False,
        "include": [],
        "truncation": "disabled",
        "reasoning": {"effort": "none", "summary": None},
        "parallel_tool_calls": True,
        "tool_choice": "none",
        "stream_options": None,
        "user": "u1",
        "prompt_cache_key": "k",
        "service_tier": "auto",
        "metadata": {"run": "1"},
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
    }
    response = created(live_engine_server, **GREEDY, input="Hi", **neutral)
    assert response["metadata"] == {"run": "1"} and response["text"]["format"] == {"type": "text"}
    assert_fits("Response", response)
