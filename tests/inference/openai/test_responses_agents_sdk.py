"""The OpenAI Agents SDK (openai-agents) running a tool-calling agent against a live
`manage.py serve`, through both of its OpenAI models: `OpenAIResponsesModel` (POST
/v1/responses) and `OpenAIChatCompletionsModel` (POST /v1/chat/completions), whole and
streamed, on the base model and an adapter.

The tiny model is random, so the agent's settings make each run deterministic: the first
turn must call the tool, once (`tool_choice="required"`, `parallel_tool_calls=False`: the
call is held to the tool's schema, greedy); the SDK then resets the choice and the second
turn answers. The Responses model's agent has a structured `output_type` (enums, so the JSON
closes within the budget: the SDK refuses a response cut at `max_output_tokens`, as it
should) and its tool is offered only until it ran (a format and tools the model may still
call cannot both hold); the chat model's agent answers in text. Either way the tool ran and
the agent ends with a final output.
"""

import asyncio
import json
from typing import Literal

import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI
from pydantic import BaseModel

from tests.inference.conftest import BASE_NAME
from tests.tiny_llama import TOOLS_CHATML_TEMPLATE

pytestmark = pytest.mark.django_db
QUESTION = "What is the weather in Paris?"
MODELS = {"responses": OpenAIResponsesModel, "chat": OpenAIChatCompletionsModel}


@pytest.fixture(scope="module")
def serve_data(serve_data):
    """The conftest's tiny model (private to this module) with a template that shows tools."""
    config_file = serve_data["base_dir"] / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["chat_template"] = TOOLS_CHATML_TEMPLATE
    config_file.write_text(json.dumps(config))
    return serve_data


@pytest.fixture(autouse=True, scope="module")
def no_tracing():
    """The SDK would send its traces to OpenAI; offline, nothing leaves the machine."""
    set_tracing_disabled(True)
    yield
    set_tracing_disabled(False)


class Report(BaseModel):
    city: Literal["Paris", "Berlin", "Rome"]
    sky: Literal["sunny", "cloudy", "rainy"]


def weather_agent(server, api: str, model: str, calls: list[str]) -> Agent:
    def not_yet_called(context, agent) -> bool:
        return not calls

    @function_tool(is_enabled=not_yet_called if api == "responses" else True)
    def get_weather(city: Literal["Paris", "Berlin", "Rome"]) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"Sunny in {city}, 21 C."

    client = AsyncOpenAI(base_url=f"{server.url}/v1", api_key=server.key_a, max_retries=0)
    return Agent(
        name="weather",
        instructions="Answer with the weather.",
        tools=[get_weather],
        model=MODELS[api](model=model, openai_client=client),
        model_settings=ModelSettings(
            tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=64
        ),
        output_type=Report if api == "responses" else None,
    )


async def run_streamed(agent: Agent):
    result = Runner.run_streamed(agent, QUESTION)
    kinds = [event.type async for event in result.stream_events()]
    assert "raw_response_event" in kinds  # the model's own stream, event by event
    return result


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("api", sorted(MODELS))
@pytest.mark.parametrize("model", [BASE_NAME, "pirate"])
def test_an_agent_calls_its_tool_and_answers(live_engine_server, api, stream, model):
    calls: list[str] = []
    agent = weather_agent(live_engine_server, api, model, calls)
    result = asyncio.run(run_streamed(agent)) if stream else Runner.run_sync(agent, QUESTION)
    (city,) = calls  # the tool ran once, on valid input
    assert city in ("Paris", "Berlin", "Rome")
    kinds = [item.type for item in result.new_items]
    assert kinds == ["tool_call_item", "tool_call_output_item", "message_output_item"]
    assert result.new_items[1].output == f"Sunny in {city}, 21 C."
    assert len(result.raw_responses) == 2  # the call, then the answer
    answer = result.raw_responses[-1].output[-1].content[0].text
    if api == "responses":
        assert isinstance(result.final_output, Report)
        assert result.final_output == Report.model_validate_json(answer)
    else:
        assert isinstance(result.final_output, str) and result.final_output == answer
