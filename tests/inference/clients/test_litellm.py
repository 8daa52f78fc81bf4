"""LiteLLM against `manage.py serve` (the tiny model, its adapter), through the providers its
users point at a vLLM server: `hosted_vllm/<model>` and `openai/<model>` with `api_base`.
Chat, streaming, tool calls and structured output (`response_format` as a JSON schema and as
a pydantic model).

The tiny model is random, so every answer that must parse is held to its JSON by the engine:
a forced tool or a JSON schema, with bounded strings, at temperature 0. Its template here
shows tools (tests/tiny_llama.py's TOOLS_CHATML_TEMPLATE).
"""

import json
import os

import pytest
from pydantic import BaseModel, ConfigDict, Field

from tests.inference.conftest import BASE_NAME
from tests.tiny_llama import TOOLS_CHATML_TEMPLATE

# LiteLLM fetches its model price list from GitHub on import unless told to use its copy.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
import litellm  # noqa: E402

pytestmark = pytest.mark.django_db
QUESTION = [
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "What is the weather in Paris?"},
]
PROVIDERS = ["hosted_vllm", "openai"]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 10},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
FORCE_WEATHER = {"type": "function", "function": {"name": "get_weather"}}


class Person(BaseModel):
    """Someone described in two fields (no other: its string would be unbounded)."""

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


def complete(server, provider: str, model: str = "pirate", **kwargs):
    kwargs.setdefault("messages", QUESTION)
    kwargs.setdefault("max_tokens", 12)
    return litellm.completion(
        model=f"{provider}/{model}",
        api_base=f"{server.url}/v1",
        api_key=server.key_a,
        temperature=0,
        num_retries=0,
        timeout=60,
        **kwargs,
    )


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("model", [BASE_NAME, "pirate"])
def test_completion_answers_with_the_servers_completion(live_engine_server, provider, model):
    reply = complete(live_engine_server, provider, model)
    direct = live_engine_server.openai().chat.completions.create(
        model=model, messages=QUESTION, temperature=0, max_tokens=12
    )
    choice = reply.choices[0]
    assert choice.message.content == direct.choices[0].message.content
    assert choice.finish_reason == direct.choices[0].finish_reason
    assert reply.usage.prompt_tokens == direct.usage.prompt_tokens
    assert reply.usage.completion_tokens == direct.usage.completion_tokens


@pytest.mark.parametrize("provider", PROVIDERS)
def test_stream_gives_the_same_text_in_pieces(live_engine_server, provider):
    whole = complete(live_engine_server, provider).choices[0].message.content
    chunks = list(
        complete(live_engine_server, provider, stream=True, stream_options={"include_usage": True})
    )
    pieces = [
        c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
    ]
    assert len(pieces) > 1 and "".join(pieces) == whole
    rebuilt = litellm.stream_chunk_builder(chunks, messages=QUESTION)
    assert rebuilt.choices[0].message.content == whole
    assert rebuilt.usage.completion_tokens >= len(pieces)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_tool_comes_back_as_a_parsed_call(live_engine_server, provider, stream):
    kwargs = {"tools": [WEATHER], "tool_choice": FORCE_WEATHER, "max_tokens": 64}
    if stream:
        chunks = list(complete(live_engine_server, provider, stream=True, **kwargs))
        reply = litellm.stream_chunk_builder(chunks, messages=QUESTION)
    else:
        reply = complete(live_engine_server, provider, **kwargs)
    choice = reply.choices[0]
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and call.id
    args = json.loads(call.function.arguments)
    assert set(args) <= {"city", "unit"} and args["unit"] in ("celsius", "fahrenheit")
    assert len(args["city"]) <= 10
    assert choice.finish_reason == "tool_calls"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_conversation_with_a_tool_result_goes_on(live_engine_server, provider):
    kwargs = {"tools": [WEATHER], "tool_choice": FORCE_WEATHER, "max_tokens": 64}
    call = complete(live_engine_server, provider, **kwargs).choices[0].message.tool_calls[0]
    messages = [
        *QUESTION,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 21}'},
    ]
    reply = complete(live_engine_server, provider, messages=messages, tools=[WEATHER])
    assert reply.choices[0].message.content


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_json_schema_response_format_is_held(live_engine_server, provider):
    schema = {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}, "size": {"enum": ["S", "M"]}},
        "required": ["color", "size"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "pick", "schema": schema, "strict": True}}
    reply = complete(live_engine_server, provider, response_format=fmt, max_tokens=32)
    answer = json.loads(reply.choices[0].message.content)
    assert answer["color"] in ("red", "green", "blue") and answer["size"] in ("S", "M")
    assert reply.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_pydantic_response_format_parses_into_the_model(live_engine_server, provider):
    reply = complete(
        live_engine_server,
        provider,
        messages=[{"role": "user", "content": "Describe a person."}],
        response_format=Person,
        max_tokens=64,
    )
    person = Person.model_validate_json(reply.choices[0].message.content)
    assert len(person.name) <= 8 and 0 <= person.age <= 120
