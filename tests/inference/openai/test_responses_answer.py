"""The response object and its events, built in this process from engine deltas the way the
server builds them (the chat builder, then answer.py): the endings the tiny model does not
reach on cue (text around a call the model chose, an empty answer, an engine that stopped)
still make OpenAI's items, statuses and events, and the deltas add up to the final text."""

import pytest

from inference.engine.outputs import RequestOutput
from inference.openai.completion_builder import CompletionBuilder
from inference.openai.responses.answer import ResponseAnswer
from inference.openai.responses.protocol import parse_responses_request
from tests.inference.openai.responses_calls import EVENT_SCHEMAS, output_text
from tests.inference.openai.schema import assert_fits

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": False,
}


def answer_to(texts: list[str], finish_reason: str = "stop", **body) -> tuple[dict, list[dict]]:
    """The final response and every event, for an answer arriving as `texts`."""
    request = parse_responses_request({"model": "m", "input": "Hi", **body})
    builder = CompletionBuilder(kind="chat", model="m", decode_token=str, tool_use=request.tool_use)
    answer = ResponseAnswer(request)
    events = answer.opening()
    for i, text in enumerate(texts):
        last = i == len(texts) - 1
        out = RequestOutput("r-0", [i], text, [], last, finish_reason if last else None, 3, i + 1)
        events += answer.add(builder.add(0, out))
    choice = builder.choices[0]
    events += answer.closing(finish_reason=choice.finish_reason, usage=builder.usage())
    for event in events:
        assert_fits(EVENT_SCHEMAS[event["type"]], event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = answer.body()
    assert_fits("Response", final)
    assert events[-1]["response"] == final
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == output_text(final)
    return final, events


def test_text_around_a_call_the_model_chose_is_a_message_each_side():
    texts = ["Let me check. ", '<tool_call>{"name": "get_weather", ', '"arguments": {"city": ']
    texts += ['"Paris"}}</tool_call>', " Done."]
    final, events = answer_to(texts, tools=[WEATHER])
    kinds = [item["type"] for item in final["output"]]
    assert kinds == ["message", "function_call", "message"]
    first, call, last = final["output"]
    assert first["content"][0]["text"] == "Let me check."  # the chat reader's content, as chat
    assert last["content"][0]["text"] == " Done."
    assert (call["name"], call["arguments"]) == ("get_weather", '{"city": "Paris"}')
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.done"] == [
        0,
        1,
        2,
    ]
    assert final["status"] == "completed"


def test_an_empty_answer_is_an_empty_message():
    final, events = answer_to([""])
    (message,) = final["output"]
    assert message["content"][0]["text"] == "" and message["status"] == "completed"
    assert events[-1]["type"] == "response.completed"


def test_an_answer_cut_by_the_budget_is_incomplete():
    final, events = answer_to(["Once upon", " a time"], finish_reason="length")
    assert final["status"] == "incomplete"
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["output"][0]["status"] == "incomplete"
    assert events[-1]["type"] == "response.incomplete"


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "name": "get_weather"}])
def test_a_forced_call_cut_by_the_budget_is_an_incomplete_call(tool_choice):
    texts = ['[{"name": "get_weather", "arguments": {"city": "Par']
    if isinstance(tool_choice, dict):
        texts = ['{"city": "Par']
    final, _ = answer_to(texts, finish_reason="length", tools=[WEATHER], tool_choice=tool_choice)
    assert final["status"] == "incomplete"
    item = final["output"][-1]
    assert item["status"] == "incomplete"


def test_an_engine_that_stopped_fails_the_response():
    final, events = answer_to(["Once"], finish_reason="abort")
    assert final["status"] == "failed" and final["error"]["code"] == "server_error"
    assert events[-1]["type"] == "response.failed"
