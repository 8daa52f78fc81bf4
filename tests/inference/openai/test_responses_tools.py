"""Function tools through POST /v1/responses against a live `manage.py serve` whose tiny model
has a chat template that shows tools (tests/tiny_llama.py's TOOLS_CHATML_TEMPLATE): a forced
call is a `function_call` item (streamed as argument deltas), and its output goes back by
`previous_response_id` or by sending the items back, to the same answer the chat API gives
for the same conversation. Greedy throughout: the argument schemas are bounded, so the
random model closes its JSON within a few dozen tokens."""

import json

import jsonschema  # type: ignore[import-untyped]
import pytest

from tests.clients import chat, refusal
from tests.inference.conftest import BASE_NAME
from tests.inference.openai.responses_calls import (
    EVENT_SCHEMAS,
    create,
    created,
    output_text,
    stream_events,
)
from tests.inference.openai.schema import assert_fits
from tests.tiny_llama import TOOLS_CHATML_TEMPLATE

pytestmark = pytest.mark.django_db
QUESTION = "What is the weather in Paris?"
WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 10},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": WEATHER_PARAMETERS,
    "strict": True,
}
TIME_PARAMETERS = {
    "type": "object",
    "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 14}},
    "required": ["zone"],
    "additionalProperties": False,
}
TIME = {"type": "function", "name": "get_time", "parameters": TIME_PARAMETERS, "strict": True}
TOOLS = [WEATHER, TIME]
PARAMETERS = {"get_weather": WEATHER_PARAMETERS, "get_time": TIME_PARAMETERS}
FORCE_WEATHER = {"type": "function", "name": "get_weather"}
GREEDY = {"model": BASE_NAME, "temperature": 0, "tools": TOOLS, "max_output_tokens": 120}


@pytest.fixture(scope="module")
def serve_data(serve_data):
    """The conftest's rows, its tiny model (private to this module) given a template that
    shows tools, before the server reads it."""
    config_file = serve_data["base_dir"] / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["chat_template"] = TOOLS_CHATML_TEMPLATE
    config_file.write_text(json.dumps(config))
    return serve_data


def chat_tool(tool: dict) -> dict:
    """The chat API's shape of a Responses function tool."""
    return {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}


def calls_of(response: dict) -> list[dict]:
    calls = [item for item in response["output"] if item["type"] == "function_call"]
    for call in calls:
        assert call["id"].startswith("fc_") and call["call_id"].startswith("call_")
        assert call["status"] == "completed"
        jsonschema.validate(json.loads(call["arguments"]), PARAMETERS[call["name"]])
    return calls


@pytest.mark.parametrize("tool_choice", [FORCE_WEATHER, "required"])
def test_a_forced_call_is_a_function_call_item(live_engine_server, tool_choice):
    body = {**GREEDY, "input": QUESTION, "tool_choice": tool_choice}
    response = created(live_engine_server, **body)
    assert_fits("CreateResponse", body)
    assert_fits("Response", response)
    assert response["status"] == "completed"
    assert response["tool_choice"] == tool_choice and response["tools"] == TOOLS
    calls = calls_of(response)
    assert calls and response["output"] == calls  # the answer is the calls, nothing else
    if tool_choice == FORCE_WEATHER:
        assert [call["name"] for call in calls] == ["get_weather"]


def test_a_streamed_call_is_its_arguments_in_deltas(live_engine_server):
    body = {**GREEDY, "input": QUESTION, "tool_choice": FORCE_WEATHER}
    whole = created(live_engine_server, **body)
    events = stream_events(create(live_engine_server, **body, stream=True))
    for event in events:
        assert_fits(EVENT_SCHEMAS[event["type"]], event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    deltas = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * len(deltas),
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert len(deltas) > 2  # the arguments stream as they are generated
    added, done = events[2]["item"], events[-2]["item"]
    assert added["type"] == "function_call" and added["arguments"] == ""
    assert added["status"] == "in_progress" and done["status"] == "completed"
    assert added["call_id"] == done["call_id"] and added["name"] == "get_weather"
    arguments = events[-3]["arguments"]
    assert "".join(deltas) == arguments == done["arguments"] == calls_of(whole)[0]["arguments"]
    assert events[-1]["response"]["output"] == [done]


def test_a_function_call_output_goes_back_by_previous_response_id(live_engine_server):
    """The model's calls and the caller's results, continued from the stored response, are
    the conversation the chat API reads from the same messages."""
    server = live_engine_server
    first = created(server, **GREEDY, input=QUESTION, tool_choice="required")
    calls = calls_of(first)
    results = [
        {"type": "function_call_output", "call_id": call["call_id"], "output": f"Result {i}."}
        for i, call in enumerate(calls)
    ]
    second = created(
        server,
        **{**GREEDY, "max_output_tokens": 8},
        input=results,
        previous_response_id=first["id"],
    )
    assert second["status"] in ("completed", "incomplete") and not calls_of(second)
    messages = [
        {"role": "user", "content": QUESTION},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call["call_id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": call["arguments"]},
                }
                for call in calls
            ],
        },
        *[{"role": "tool", "tool_call_id": r["call_id"], "content": r["output"]} for r in results],
    ]
    expected = chat(
        server,
        server.key_a,
        model=BASE_NAME,
        messages=messages,
        tools=[chat_tool(tool) for tool in TOOLS],
        max_tokens=8,
        temperature=0,
    ).json()
    assert output_text(second) == expected["choices"][0]["message"]["content"]
    assert second["usage"]["input_tokens"] == expected["usage"]["prompt_tokens"]
    # the same conversation sent back whole, output items as they came (ids, statuses)
    resent = created(
        server,
        **{**GREEDY, "max_output_tokens": 8},
        input=[{"role": "user", "content": QUESTION}, *first["output"], *results],
    )
    assert output_text(resent) == output_text(second)
    assert resent["usage"]["input_tokens"] == second["usage"]["input_tokens"]


def test_an_output_must_answer_a_call_of_the_turn_before(live_engine_server):
    server = live_engine_server
    first = created(server, **GREEDY, input=QUESTION, tool_choice=FORCE_WEATHER)
    stray = {"type": "function_call_output", "call_id": "call_nope", "output": "1"}
    error = refusal(
        server,
        "responses",
        {**GREEDY, "input": [stray], "previous_response_id": first["id"]},
    )
    assert error["param"] == "input[0].call_id" and "call_nope" in error["message"]


UNSUPPORTED = {**WEATHER, "parameters": {"type": "object", "not": {}}}


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [UNSUPPORTED], "tool_choice": FORCE_WEATHER}, "tools[0].parameters"),
        ({"tools": [UNSUPPORTED], "tool_choice": "required"}, "tools"),
        ({"tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": {"type": "allowed_tools", "tools": []}}, "tool_choice"),
    ],
)
def test_bad_tool_use_is_refused_before_the_engine(live_engine_server, fields, param):
    error = refusal(live_engine_server, "responses", {**GREEDY, "input": QUESTION, **fields})
    assert error["param"] == param, error["message"]
