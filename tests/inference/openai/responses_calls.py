"""Calling POST /v1/responses of a live server, and reading its event stream, for the
Responses API tests."""

import json

import httpx

from tests.clients import http

# OpenAI's schema for each event type this server sends (openai_schema/).
EVENT_SCHEMAS = {
    "response.created": "ResponseCreatedEvent",
    "response.in_progress": "ResponseInProgressEvent",
    "response.output_item.added": "ResponseOutputItemAddedEvent",
    "response.output_item.done": "ResponseOutputItemDoneEvent",
    "response.content_part.added": "ResponseContentPartAddedEvent",
    "response.content_part.done": "ResponseContentPartDoneEvent",
    "response.output_text.delta": "ResponseTextDeltaEvent",
    "response.output_text.done": "ResponseTextDoneEvent",
    "response.function_call_arguments.delta": "ResponseFunctionCallArgumentsDeltaEvent",
    "response.function_call_arguments.done": "ResponseFunctionCallArgumentsDoneEvent",
    "response.completed": "ResponseCompletedEvent",
    "response.incomplete": "ResponseIncompleteEvent",
    "response.failed": "ResponseFailedEvent",
    "error": "ResponseErrorEvent",
}


def create(server, key: str | None = None, **body) -> httpx.Response:
    return http(server, "POST", "/v1/responses", key=key or server.key_a, json=body)


def created(server, key: str | None = None, **body) -> dict:
    """The response object of a request that must succeed."""
    answer = create(server, key, **body)
    assert answer.status_code == 200, answer.text
    return answer.json()


def stream_events(response: httpx.Response) -> list[dict]:
    """The events of a whole Responses stream: each `event:` line names its data's type."""
    events = []
    for block in response.text.split("\n\n"):
        if not block.strip():
            continue
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        event = json.loads(lines["data"])
        assert lines["event"] == event["type"], block
        events.append(event)
    return events


def output_text(body: dict) -> str:
    """What the SDKs' `output_text` is: every message's text, in order."""
    return "".join(
        part["text"]
        for item in body["output"]
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    )
