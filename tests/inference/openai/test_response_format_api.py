"""`response_format` over HTTP with the real `openai` client, against `manage.py serve` with
the tiny model (and its adapter): the engine holds the random model to the JSON asked for,
streamed or not, on both endpoints; bad formats and schemas are 400s before the engine.

The tiny model's template here is plain ChatML, like SmolLM2's: it cannot show tools, so
tools sent to it are refused too (the last test).
"""

import json
from functools import partial

import jsonschema  # type: ignore[import-untyped]
import pytest

from tests.clients import openai_chat, refusal
from tests.engine.structured_output_schemas import ENUMS, NESTED, UNSUPPORTED
from tests.inference.conftest import BASE_NAME

pytestmark = pytest.mark.django_db
QUESTION = [{"role": "user", "content": "Describe a person."}]
SEED = 11


def json_schema(schema, name="answer"):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


chat = partial(
    openai_chat, model=BASE_NAME, messages=QUESTION, temperature=1.0, seed=SEED, max_tokens=80
)


@pytest.mark.parametrize("model", [BASE_NAME, "pirate"])
def test_a_json_schema_answer_validates(live_engine_server, model):
    reply = chat(live_engine_server, model=model, response_format=json_schema(NESTED), n=2)
    for choice in reply.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), NESTED)


def test_a_streamed_json_schema_answer_is_the_same_json(live_engine_server):
    whole = chat(live_engine_server, response_format=json_schema(ENUMS))
    chunks = list(chat(live_engine_server, response_format=json_schema(ENUMS), stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1
    jsonschema.validate(json.loads(text), ENUMS)
    assert chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.parametrize("stream", [False, True])
def test_json_object_on_both_endpoints(live_engine_server, stream):
    client = live_engine_server.openai()
    # Any object's strings are unbounded: this seed closes it at once on both models.
    kwargs = {"temperature": 1.0, "seed": 1, "max_tokens": 80, "stream": stream}
    fmt = {"type": "json_object"}
    answers = [
        client.chat.completions.create(
            model=BASE_NAME, messages=QUESTION, response_format=fmt, **kwargs
        ),
        client.completions.create(
            model="pirate", prompt="A JSON object:", extra_body={"response_format": fmt}, **kwargs
        ),
    ]
    for answer, kind in zip(answers, ("chat", "text"), strict=True):
        if stream:
            chunks = [c for c in answer if c.choices]
            text = "".join(
                (c.choices[0].delta.content or "") if kind == "chat" else c.choices[0].text
                for c in chunks
            )
            finish = chunks[-1].choices[0].finish_reason
        else:
            choice = answer.choices[0]
            text = choice.message.content if kind == "chat" else choice.text
            finish = choice.finish_reason
        assert finish == "stop" and isinstance(json.loads(text), dict), text


def test_response_format_text_changes_nothing(live_engine_server):
    plain = chat(live_engine_server, max_tokens=8)
    text = chat(live_engine_server, max_tokens=8, response_format={"type": "text"})
    assert text.choices[0].message.content == plain.choices[0].message.content


@pytest.mark.parametrize(
    "response_format, param, words",
    [
        ({"type": "yaml"}, "response_format.type", "json_schema"),
        ({"type": "json_schema"}, "response_format.json_schema", "required"),
        (
            {"type": "json_schema", "json_schema": {"name": "a b", "schema": NESTED}},
            "response_format.json_schema.name",
            "a-z",
        ),
        (
            json_schema({"type": "object", "properties": {"a": {"type": "strnig"}}}),
            "response_format.json_schema.schema",
            "not a valid JSON Schema",
        ),
        *[
            (json_schema(schema), "response_format.json_schema.schema", repr(keyword.split("/")[0]))
            for keyword, schema in UNSUPPORTED.items()
        ],
    ],
)
@pytest.mark.parametrize("path", ["chat/completions", "completions"])
def test_a_bad_response_format_is_a_400_before_the_engine(
    live_engine_server, path, response_format, param, words
):
    body = {"model": BASE_NAME, "max_tokens": 4, "response_format": response_format}
    body.update({"messages": QUESTION} if path.startswith("chat") else {"prompt": "Hi"})
    error = refusal(live_engine_server, path, body)
    assert error["param"] == param and words in error["message"], error["message"]


def test_tools_on_a_template_that_cannot_show_them_are_refused(live_engine_server):
    tools = [{"type": "function", "function": {"name": "get_time"}}]
    for choice in ("auto", "required", {"type": "function", "function": {"name": "get_time"}}):
        body = {"model": BASE_NAME, "messages": QUESTION, "tools": tools, "tool_choice": choice}
        error = refusal(live_engine_server, "chat/completions", body)
        assert error["param"] == "tools"
        assert "chat template does not support tools" in error["message"]
    # tool_choice "none": the tools are not shown, so any template will do
    reply = chat(live_engine_server, max_tokens=4, tools=tools, tool_choice="none")
    assert reply.choices[0].message.content and reply.choices[0].message.tool_calls is None
