"""Tools on chat requests without a server: what `tools`, `tool_choice`, tool calls in
`messages` may hold (each refusal names its field), the JSON a forced call is held to, and
the chat templates that can show tools."""

import json
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest

from inference.engine.tokenizer import Tokenizer, TokenizerError
from inference.errors import ProtocolError
from inference.openai.protocol import parse_chat_messages
from tests.inference.openai.bodies import parsed_chat
from tests.tiny_llama import CHATML_TEMPLATE, TOOLS_CHATML_TEMPLATE, build_tokenizer

USER = [{"role": "user", "content": "Weather in Paris?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}  # no parameters


def refused(**body) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        parsed_chat(**body)
    assert caught.value.status == 400 and caught.value.message
    return caught.value


# ---------------------------------------------------------------- tools and tool_choice


def test_tools_default_to_auto_and_reach_the_template_as_given():
    use = parsed_chat(tools=[WEATHER, TIME]).tool_use
    assert use.mode == "auto" and use.names == ("get_weather", "get_time")
    assert use.template_tools()[0] == WEATHER
    # a function without parameters takes none
    assert use.template_tools()[1]["function"]["parameters"] == {"type": "object", "properties": {}}
    # auto: the model chooses, nothing forced
    assert parsed_chat(tools=[WEATHER]).constraint is None


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"tools": []},
        {"tools": None, "tool_choice": "none"},
        {"tool_choice": "auto"},
        {"tools": [WEATHER], "tool_choice": "none"},
        {"tools": [WEATHER], "tool_choice": "none", "parallel_tool_calls": True},
    ],
)
def test_without_tools_or_with_tool_choice_none_the_answer_is_plain_content(body):
    request = parsed_chat(**body)
    assert request.tool_use is None and request.constraint is None


def test_a_named_function_holds_the_answer_to_its_parameters():
    request = parsed_chat(
        tools=[TIME, WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}}
    )
    assert request.tool_use.mode == "function" and request.tool_use.function == "get_weather"
    assert request.constraint.schema == WEATHER["function"]["parameters"]
    assert request.constraint.param == "tools[1].function.parameters"


@pytest.mark.parametrize("parallel, most", [(None, None), (True, None), (False, 1)])
def test_required_holds_the_answer_to_a_list_of_calls_of_the_tools(parallel, most):
    request = parsed_chat(
        tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=parallel
    )
    schema = request.constraint.schema
    assert request.constraint.param == "tools" and schema.get("maxItems") == most
    validator = jsonschema.Draft202012Validator(schema)
    validator.check_schema(schema)
    good = [
        {"name": "get_weather", "arguments": {"city": "Paris"}},
        {"name": "get_time", "arguments": {}},
    ]
    assert validator.is_valid(good[:1])
    assert validator.is_valid(good) == (most is None)
    for bad in (
        [],
        [{"name": "get_weather", "arguments": {}}],  # its required city is missing
        [{"name": "get_money", "arguments": {}}],
        [{"name": "get_time"}],
        {"name": "get_time", "arguments": {}},
    ):
        assert not validator.is_valid(bad), bad


def bad_tool(**function):
    return [{"type": "function", "function": {"name": "f", **function}}]


@pytest.mark.parametrize(
    "body, param, words",
    [
        ({"tools": {"f": {}}}, "tools", "list"),
        ({"tools": [WEATHER] * 2}, "tools[1].function.name", "twice"),
        ({"tools": [TIME] * 129}, "tools", "at most 128"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0]", '"type": "function"'),
        ({"tools": ["get_weather"]}, "tools[0]", '"type": "function"'),
        ({"tools": [{**WEATHER, "extra": 1}]}, "tools[0]", "extra"),
        ({"tools": [{"type": "function"}]}, "tools[0].function", "name"),
        ({"tools": bad_tool(name="has space")}, "tools[0].function.name", "a-z"),
        ({"tools": bad_tool(name="x" * 65)}, "tools[0].function.name", "1 to 64"),
        ({"tools": [{"type": "function", "function": {}}]}, "tools[0].function.name", "a-z"),
        ({"tools": bad_tool(description=3)}, "tools[0].function.description", "string"),
        ({"tools": bad_tool(strict="yes")}, "tools[0].function.strict", "boolean"),
        ({"tools": bad_tool(parameters="{}")}, "tools[0].function.parameters", "JSON Schema"),
        (
            {"tools": bad_tool(parameters={"type": "object", "properties": {"a": {"type": "x"}}})},
            "tools[0].function.parameters",
            "not a valid JSON Schema",
        ),
        (
            {"tools": bad_tool(parameters={"type": "string"})},
            "tools[0].function.parameters",
            "object",
        ),
        ({"tools": bad_tool(returns={})}, "tools[0].function", "returns"),
        ({"tools": [WEATHER], "tool_choice": "any"}, "tool_choice", "none, auto, required"),
        ({"tools": [WEATHER], "tool_choice": 1}, "tool_choice", "required"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "f"}}},
            "tool_choice",
            "not among the tools",
        ),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "name": "get_weather"}},
            "tool_choice",
            "function",
        ),
        ({"tool_choice": "required"}, "tool_choice", "no tools"),
        ({"tools": [], "tool_choice": "required"}, "tool_choice", "no tools"),
        (
            {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
            "tool_choice",
            "not among the tools",
        ),
        ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls", "boolean"),
        (
            {"tools": [WEATHER], "response_format": {"type": "json_object"}},
            "response_format",
            "tool_choice",
        ),
        ({"functions": [WEATHER["function"]]}, "functions", "not supported"),
        ({"function_call": "auto"}, "function_call", "not supported"),
    ],
)
def test_a_bad_tools_request_is_refused_naming_the_field(body, param, words):
    error = refused(**body)
    assert error.param == param and words in error.message, error.message


def test_response_format_goes_with_tool_choice_none():
    request = parsed_chat(
        tools=[WEATHER], tool_choice="none", response_format={"type": "json_object"}
    )
    assert request.tool_use is None and request.constraint.schema is None


# ---------------------------------------------------------------- tool calls in messages

CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
TURN: list[dict[str, Any]] = [
    *USER,
    {"role": "assistant", "content": None, "tool_calls": [CALL], "refusal": None},
    {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C."},
]


def test_a_tool_round_trip_reaches_the_template_in_hugging_faces_shape():
    messages = parsed_chat(messages=TURN).messages
    assert messages[1] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            }
        ],
    }
    assert messages[2] == {"role": "tool", "content": "Sunny, 21 C.", "tool_call_id": "call_1"}


def test_several_calls_are_answered_in_any_order():
    second = {**CALL, "id": "call_2"}
    messages = [
        *USER,
        {"role": "assistant", "content": "Checking.", "tool_calls": [CALL, second]},
        {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "b"}]},
        {"role": "tool", "tool_call_id": "call_1", "content": ""},
        {"role": "user", "content": "Thanks."},
    ]
    parsed = parsed_chat(messages=messages).messages
    assert [m["role"] for m in parsed] == ["user", "assistant", "tool", "tool", "user"]
    assert parsed[1]["content"] == "Checking." and parsed[2]["content"] == "b"


def with_turn(i: int, **fields) -> list[dict]:
    messages = [dict(m) for m in TURN]
    messages[i].update(fields)
    return [{k: v for k, v in m.items() if v != "DROP"} for m in messages]


@pytest.mark.parametrize(
    "messages, param",
    [
        (with_turn(2, tool_call_id="call_9"), "messages[2].tool_call_id"),
        (with_turn(2, tool_call_id="DROP"), "messages[2].tool_call_id"),
        (with_turn(2, tool_call_id=1), "messages[2].tool_call_id"),
        ([*TURN, TURN[2]], "messages[3].tool_call_id"),  # answered twice
        ([*USER, TURN[2]], "messages[1].tool_call_id"),  # no call before it
        ([*TURN[:2], *USER, TURN[2]], "messages[3].tool_call_id"),  # not right after the calls
        (with_turn(2, name="get_weather"), "messages[2]"),
        (with_turn(2, content=None), "messages[2].content"),
        (with_turn(1, content=None, tool_calls=None), "messages[1].content"),
        (with_turn(1, tool_calls={"id": "x"}), "messages[1].tool_calls"),
        (with_turn(1, tool_calls=[{**CALL, "type": "code"}]), "messages[1].tool_calls[0]"),
        (with_turn(1, tool_calls=[{**CALL, "id": ""}]), "messages[1].tool_calls[0]"),
        (
            with_turn(1, tool_calls=[{**CALL, "function": {"name": "get_weather"}}]),
            "messages[1].tool_calls[0]",
        ),
        (
            with_turn(1, tool_calls=[{**CALL, "function": {"name": "f", "arguments": {"a": 1}}}]),
            "messages[1].tool_calls[0]",
        ),
        (
            with_turn(1, tool_calls=[{**CALL, "function": {"name": "f", "arguments": "[1]"}}]),
            "messages[1].tool_calls[0].function.arguments",
        ),
        (
            with_turn(1, tool_calls=[{**CALL, "function": {"name": "f", "arguments": "{"}}]),
            "messages[1].tool_calls[0].function.arguments",
        ),
        (with_turn(1, refusal=3), "messages[1].refusal"),
        (with_turn(1, audio={}), "messages[1]"),
        (with_turn(0, tool_calls=[CALL]), "messages[0]"),  # only the assistant calls tools
    ],
)
def test_a_bad_tool_message_is_refused_naming_the_field(messages, param):
    error = refused(messages=messages)
    assert error.param == param, error.message


def test_eval_set_messages_still_take_no_tool_calls_or_tool_results():
    with pytest.raises(ProtocolError) as caught:
        parse_chat_messages(TURN)
    assert caught.value.param == "messages[1]" and "tool_calls" in caught.value.message
    with pytest.raises(ProtocolError) as caught:
        parse_chat_messages([*USER, TURN[2]])
    assert caught.value.param == "messages[1].role"


# ---------------------------------------------------------------- chat templates


def tokenizer(tmp_path, template: str | None) -> Tokenizer:
    build_tokenizer().save(str(tmp_path / "tokenizer.json"))
    config = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "chat_template": template}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return Tokenizer.from_folder(tmp_path)


def test_a_template_that_reads_tools_shows_them_and_the_calls(tmp_path):
    tok = tokenizer(tmp_path, TOOLS_CHATML_TEMPLATE)
    request = parsed_chat(messages=TURN, tools=[WEATHER])
    prompt = tok.apply_chat_template(request.messages, tools=request.tool_use.template_tools())
    assert tok.supports_tools
    assert "<tools> get_weather </tools>" in prompt
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        in prompt
    )
    assert "<tool_response>\nSunny, 21 C.\n</tool_response>" in prompt
    assert "<tools>" not in tok.apply_chat_template(USER)  # no tools: nothing about them


def test_plain_chatml_does_not_support_tools(tmp_path):
    assert not tokenizer(tmp_path, CHATML_TEMPLATE).supports_tools
    with pytest.raises(TokenizerError, match="does not support tools"):
        tokenizer(tmp_path, CHATML_TEMPLATE).apply_chat_template(USER, tools=[WEATHER])


@pytest.mark.slow
def test_smollm2s_own_template_does_not_support_tools():
    from tests.smollm2 import smollm2_dir

    assert not Tokenizer.from_folder(smollm2_dir()).supports_tools
