"""langchain-openai's ChatOpenAI against `manage.py serve` (the tiny model, its adapter), as an
application built on LangChain points it at a vLLM server: chat, streaming, tool calls
(`bind_tools`) and structured output (`with_structured_output`, both of its methods).

The tiny model is random, so every answer that must parse is held to its JSON by the engine:
a forced tool (`tool_choice` naming it) or a JSON schema, with bounded strings, at
temperature 0. Its template here shows tools (tests/tiny_llama.py's TOOLS_CHATML_TEMPLATE).
"""

import json
from typing import Literal

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, ConfigDict, Field

from tests.inference.conftest import BASE_NAME
from tests.tiny_llama import TOOLS_CHATML_TEMPLATE

pytestmark = pytest.mark.django_db
QUESTION = [SystemMessage("You answer briefly."), HumanMessage("What is the weather in Paris?")]


# `extra="forbid"`: no other property (its string would be unbounded) in the schema sent.
class GetWeather(BaseModel):
    """The weather in a city."""

    model_config = ConfigDict(extra="forbid")
    city: str = Field(max_length=10, description="The city.")
    unit: Literal["celsius", "fahrenheit"]


class Person(BaseModel):
    """Someone described in two fields."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=8)
    age: int = Field(ge=0, le=120)


@pytest.fixture(scope="module")
def serve_data(serve_data):
    """The conftest's rows, its tiny model (private to this module) given a template that
    shows tools, before the server reads it."""
    config_file = serve_data["base_dir"] / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["chat_template"] = TOOLS_CHATML_TEMPLATE
    config_file.write_text(json.dumps(config))
    return serve_data


def chat_model(server, model: str = "pirate", **kwargs) -> ChatOpenAI:
    return ChatOpenAI(
        model=model,
        base_url=f"{server.url}/v1",
        api_key=server.key_a,
        temperature=0,
        max_completion_tokens=kwargs.pop("max_tokens", 12),  # the field's alias
        max_retries=0,
        timeout=60,
        **kwargs,
    )


@pytest.mark.parametrize("model", [BASE_NAME, "pirate"])
def test_invoke_answers_with_the_servers_completion(live_engine_server, model):
    reply = chat_model(live_engine_server, model).invoke(QUESTION)
    assert isinstance(reply, AIMessage) and reply.content
    direct = live_engine_server.openai().chat.completions.create(
        model=model,
        messages=[
            {"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": "What is the weather in Paris?"},
        ],
        temperature=0,
        max_tokens=12,
    )
    assert reply.content == direct.choices[0].message.content
    usage = reply.usage_metadata
    assert usage is not None and usage["input_tokens"] == direct.usage.prompt_tokens
    assert reply.response_metadata["finish_reason"] in ("stop", "length")
    assert reply.response_metadata["model_name"] == model


def test_stream_gives_the_same_text_in_pieces(live_engine_server):
    llm = chat_model(live_engine_server, stream_usage=True)
    whole = llm.invoke(QUESTION)
    chunks = list(llm.stream(QUESTION))
    assert len([c for c in chunks if c.content]) > 1
    assert "".join(str(c.content) for c in chunks) == whole.content
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged += chunk
    assert merged.usage_metadata["output_tokens"] == whole.usage_metadata["output_tokens"]


@pytest.mark.parametrize("tool", [GetWeather, "openai_dict"])
def test_bind_tools_with_a_forced_tool_returns_a_parsed_call(live_engine_server, tool):
    schema = GetWeather.model_json_schema()
    definition = (
        tool
        if tool is GetWeather
        else {
            "type": "function",
            "function": {
                "name": "GetWeather",
                "description": "The weather in a city.",
                "parameters": {
                    k: schema[k] for k in ("type", "properties", "required", "additionalProperties")
                },
            },
        }
    )
    llm = chat_model(live_engine_server, max_tokens=64).bind_tools(
        [definition], tool_choice="GetWeather"
    )
    reply = llm.invoke(QUESTION)
    (call,) = reply.tool_calls
    assert call["name"] == "GetWeather" and call["id"]
    GetWeather.model_validate(call["args"])  # the engine held the arguments to the schema
    assert reply.response_metadata["finish_reason"] == "tool_calls"
    # the call answered, the conversation goes on (tool messages through the template)
    followup = chat_model(live_engine_server).invoke(
        [*QUESTION, reply, ToolMessage('{"temp": 21}', tool_call_id=call["id"])]
    )
    assert followup.content and not followup.tool_calls


def test_a_streamed_tool_call_merges_into_the_same_call(live_engine_server):
    llm = chat_model(live_engine_server, max_tokens=64).bind_tools(
        [GetWeather], tool_choice="GetWeather"
    )
    whole = llm.invoke(QUESTION)
    merged = None
    for chunk in llm.stream(QUESTION):
        merged = chunk if merged is None else merged + chunk
    assert merged is not None
    assert [(c["name"], c["args"]) for c in merged.tool_calls] == [
        (c["name"], c["args"]) for c in whole.tool_calls
    ]


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_structured_output_comes_back_as_the_pydantic_model(live_engine_server, method):
    llm = chat_model(live_engine_server, max_tokens=64)
    structured = llm.with_structured_output(Person, method=method)
    person = structured.invoke("Describe a person.")
    assert isinstance(person, Person)
    assert len(person.name) <= 8 and 0 <= person.age <= 120


def test_structured_output_from_a_json_schema_dict(live_engine_server):
    schema = {
        "title": "color",
        "description": "A color and a size.",
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}, "size": {"enum": ["S", "M"]}},
        "required": ["color", "size"],
        "additionalProperties": False,
    }
    structured = chat_model(live_engine_server, max_tokens=32).with_structured_output(
        schema, method="json_schema", strict=True
    )
    answer = structured.invoke("Pick a color.")
    assert answer["color"] in ("red", "green", "blue") and answer["size"] in ("S", "M")
