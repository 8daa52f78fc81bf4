"""Tools over HTTP with the real `openai` client, against `manage.py serve` whose tiny model has
a chat template that shows tools (tests/tiny_llama.py's TOOLS_CHATML_TEMPLATE).

Forced calls (a named function, "required") are held to their JSON by the engine, so even
the random tiny model answers with calls the client parses; with "auto" it writes no call
(its parsing is tested on crafted answers in test_tools_call_reading.py), so those tests
check the path: tools in the prompt, plain content back.
"""

import json
from functools import partial

import jsonschema  # type: ignore[import-untyped]
import openai
import pytest

from tests.clients import http, openai_chat, refusal, sse_events
from tests.inference.conftest import BASE_NAME
from tests.inference.openai.schema import assert_fits
from tests.tiny_llama import TOOLS_CHATML_TEMPLATE

pytestmark = pytest.mark.django_db
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
SEED = 7
# Bounded strings and enums: the random model closes its JSON within a few dozen tokens.
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
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": WEATHER_PARAMETERS,
    },
}
TIME_PARAMETERS = {
    "type": "object",
    "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 14}},
    "required": ["zone"],
    "additionalProperties": False,
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": TIME_PARAMETERS}}
TOOLS = [WEATHER, TIME]
PARAMETERS = {"get_weather": WEATHER_PARAMETERS, "get_time": TIME_PARAMETERS}
FORCE_WEATHER = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def serve_data(serve_data):
    """The conftest's rows, its tiny model (private to this module) given a template that
    shows tools, before the server reads it."""
    config_file = serve_data["base_dir"] / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["chat_template"] = TOOLS_CHATML_TEMPLATE
    config_file.write_text(json.dumps(config))
    return serve_data


chat = partial(
    openai_chat, model=BASE_NAME, messages=QUESTION, temperature=1.0, seed=SEED, max_tokens=64
)


def assert_valid_calls(calls, names=("get_weather",)):
    assert calls, "no tool calls"
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), PARAMETERS[call.function.name])
    assert len({call.id for call in calls}) == len(calls)


@pytest.mark.parametrize("model", [BASE_NAME, "pirate"])
def test_a_named_function_is_called_with_valid_arguments(live_engine_server, model):
    reply = chat(live_engine_server, model=model, tools=TOOLS, tool_choice=FORCE_WEATHER, n=2)
    for choice in reply.choices:
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content is None
        (call,) = choice.message.tool_calls
        assert_valid_calls([call])
    ids = [c.message.tool_calls[0].id for c in reply.choices]
    assert len(set(ids)) == 2  # each choice has its own call


def test_a_streamed_named_call_accumulates_to_the_same_call(live_engine_server):
    whole = chat(live_engine_server, tools=TOOLS, tool_choice=FORCE_WEATHER)
    with live_engine_server.openai().chat.completions.stream(
        model=BASE_NAME,
        messages=QUESTION,
        temperature=1.0,
        seed=SEED,
        max_tokens=64,
        tools=TOOLS,
        tool_choice=FORCE_WEATHER,
    ) as stream:
        chunks = list(stream)
        streamed = stream.get_final_completion()
    (call,) = streamed.choices[0].message.tool_calls
    expected = whole.choices[0].message.tool_calls[0]
    assert (call.function.name, call.function.arguments) == (
        expected.function.name,
        expected.function.arguments,
    )
    assert streamed.choices[0].finish_reason == "tool_calls"
    fragments = [
        c.chunk.choices[0].delta.tool_calls
        for c in chunks
        if c.type == "chunk" and c.chunk.choices and c.chunk.choices[0].delta.tool_calls
    ]
    assert len(fragments) > 2  # the arguments stream as they are generated
    assert fragments[0][0].id == call.id and fragments[0][0].function.name == "get_weather"


@pytest.mark.parametrize("parallel", [False, True])
def test_required_calls_one_or_more_of_the_tools(live_engine_server, parallel):
    reply = chat(
        live_engine_server,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=parallel,
        n=3,
        max_tokens=120,
    )
    for choice in reply.choices:
        assert choice.finish_reason == "tool_calls", choice
        calls = choice.message.tool_calls
        assert_valid_calls(calls, names=("get_weather", "get_time"))
        if not parallel:
            assert len(calls) == 1


def test_a_streamed_required_call_matches_the_whole_answer(live_engine_server):
    kwargs = {"tools": TOOLS, "tool_choice": "required", "max_tokens": 120}
    whole = chat(live_engine_server, **kwargs).choices[0]
    calls: dict[int, dict] = {}
    finish = None
    for chunk in chat(live_engine_server, stream=True, **kwargs):
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        assert not choice.delta.content
        for entry in choice.delta.tool_calls or []:
            call = calls.setdefault(entry.index, {"name": "", "arguments": ""})
            call["name"] += entry.function.name or ""
            call["arguments"] += entry.function.arguments or ""
    assert finish == whole.finish_reason == "tool_calls"
    assert [calls[i] for i in sorted(calls)] == [
        {"name": c.function.name, "arguments": c.function.arguments}
        for c in whole.message.tool_calls
    ]


def test_auto_shows_the_tools_and_returns_the_models_content(live_engine_server):
    plain = chat(live_engine_server, max_tokens=8)
    for stream in (False, True):
        kwargs = {"tools": TOOLS, "tool_choice": "auto", "max_tokens": 8}
        if stream:
            chunks = list(
                chat(
                    live_engine_server,
                    stream=True,
                    stream_options={"include_usage": True},
                    **kwargs,
                )
            )
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert not any(c.choices[0].delta.tool_calls for c in chunks if c.choices)
            usage = chunks[-1].usage
            finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        else:
            reply = chat(live_engine_server, **kwargs)
            text, usage = reply.choices[0].message.content, reply.usage
            finish = reply.choices[0].finish_reason
            assert reply.choices[0].message.tool_calls is None
        assert text and finish in ("stop", "length")
        # the template wrote the tools into the prompt
        assert usage.prompt_tokens > plain.usage.prompt_tokens + 5


def test_tool_choice_none_shows_no_tools_and_calls_none(live_engine_server):
    plain = chat(live_engine_server, max_tokens=8)
    reply = chat(live_engine_server, max_tokens=8, tools=TOOLS, tool_choice="none")
    assert reply.usage.prompt_tokens == plain.usage.prompt_tokens
    assert reply.choices[0].message.content == plain.choices[0].message.content
    assert reply.choices[0].message.tool_calls is None


def test_a_tool_result_goes_back_to_the_model(live_engine_server):
    call_reply = chat(live_engine_server, tools=TOOLS, tool_choice=FORCE_WEATHER)
    message = call_reply.choices[0].message  # sent back as the client returned it
    result = {
        "role": "tool",
        "tool_call_id": message.tool_calls[0].id,
        "content": "Sunny, 21 C.",
    }
    reply = chat(
        live_engine_server, messages=[*QUESTION, message, result], tools=TOOLS, max_tokens=8
    )
    assert reply.choices[0].message.content
    # the call and its result are in the prompt
    assert reply.usage.prompt_tokens > call_reply.usage.prompt_tokens + 20


@pytest.mark.parametrize("tool_choice", [FORCE_WEATHER, "required", "auto"])
def test_tool_call_answers_and_chunks_fit_openais_schema(live_engine_server, tool_choice):
    body = {
        "model": BASE_NAME,
        "messages": QUESTION,
        "tools": TOOLS,
        "tool_choice": tool_choice,
        "seed": SEED,
        "max_tokens": 120,
        "n": 2,
    }
    server = live_engine_server
    whole = http(server, "POST", "/v1/chat/completions", key=server.key_a, json=body)
    assert whole.status_code == 200, whole.text
    assert_fits("CreateChatCompletionResponse", whole.json())
    streamed = http(
        server, "POST", "/v1/chat/completions", key=server.key_a, json={**body, "stream": True}
    )
    for chunk in sse_events(streamed):
        assert_fits("CreateChatCompletionStreamResponse", chunk)


NAMED_UNSUPPORTED = [
    {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "not": {}}}}
]


@pytest.mark.parametrize(
    "fields, param, words",
    [
        (
            {"tools": [{"type": "function", "function": {"name": "a b"}}]},
            "tools[0].function.name",
            "a-z",
        ),
        ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name", "twice"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "auto"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
            "not among the tools",
        ),
        (
            {"tools": TOOLS, "response_format": {"type": "json_object"}},
            "response_format",
            "tool_choice",
        ),
        (
            {
                "tools": NAMED_UNSUPPORTED,
                "tool_choice": {"type": "function", "function": {"name": "f"}},
            },
            "tools[0].function.parameters",
            "'not'",
        ),
        ({"tools": NAMED_UNSUPPORTED, "tool_choice": "required"}, "tools", "'not'"),
        (
            {"messages": [*QUESTION, {"role": "tool", "tool_call_id": "x", "content": "1"}]},
            "messages[1].tool_call_id",
            "tool call",
        ),
    ],
)
def test_bad_tools_are_refused_before_the_engine(live_engine_server, fields, param, words):
    body = {"model": BASE_NAME, "messages": QUESTION, "max_tokens": 4, **fields}
    error = refusal(live_engine_server, "chat/completions", body)
    assert error["param"] == param and words in error["message"], error["message"]
    with pytest.raises(openai.BadRequestError):  # the client raises it as such too
        live_engine_server.openai().chat.completions.create(**body)
