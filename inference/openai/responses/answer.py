"""A response's output items and stream events, built from the chat builder's chunks.

The chat builder (../completion_builder.py) already reads the model's text into content and
tool calls as it streams; each of its chunks becomes the Responses events that say the same:
a message item whose `output_text` grows delta by delta, or a `function_call` item whose
`arguments` do. A streamed and a whole answer go through this one builder, so the deltas a
client concatenates equal the final response's text.
"""

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from platform_site.errors import ApiError

from .protocol import ResponsesRequest

# The engine's finish -> the response's status, and why it is incomplete.
_STATUS = {"length": "incomplete", "abort": "failed"}
_ABORTED = {
    "code": "server_error",
    "message": "The engine stopped before the answer was complete; try again.",
}


def sse_event(event: dict) -> bytes:
    """OpenAI's framing: each event named on its own line, then its data."""
    return f"event: {event['type']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n".encode()


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass
class ResponseAnswer:
    """One response as it is built: its items, status and usage, and the events that tell
    them in order (`sequence_number` counts every event of the stream)."""

    request: ResponsesRequest
    id: str = field(default_factory=lambda: _new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))
    output: list[dict] = field(default_factory=list)
    status: str = "in_progress"
    usage: dict | None = None
    completed_at: int | None = None
    _open: dict | None = None  # the item still growing
    _calls: dict[int, dict] = field(default_factory=dict)  # the chat chunk's call index -> item
    _positions: dict[str, int] = field(default_factory=dict)  # item id -> its output_index
    _sequence: int = 0

    def opening(self) -> list[dict]:
        return [
            self._event("response.created", response=self.body()),
            self._event("response.in_progress", response=self.body()),
        ]

    def add(self, chunk: dict | None) -> list[dict]:
        """The events one chat chunk amounts to (none for a chunk that adds nothing)."""
        if chunk is None or not chunk["choices"]:
            return []
        delta = chunk["choices"][0]["delta"]
        events: list[dict] = []
        if delta.get("content"):
            events += self._text(delta["content"])
        for entry in delta.get("tool_calls") or []:
            events += self._call(entry)
        return events

    def closing(self, *, finish_reason: str | None, usage: dict) -> list[dict]:
        """The open item done, then the whole response: completed, incomplete (cut at
        `max_output_tokens`) or failed (the engine stopped)."""
        self.status = _STATUS.get(finish_reason or "", "completed")
        events: list[dict] = []
        if not self.output:  # the model ended at once: an empty message, as OpenAI's
            events += self._open_message()
        events += self._close("completed" if self.status == "completed" else "incomplete")
        self.usage = {
            "input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"],
        }
        self.completed_at = int(time.time())
        terminal = {"incomplete": "response.incomplete", "failed": "response.failed"}
        kind = terminal.get(self.status, "response.completed")
        events.append(self._event(kind, response=self.body()))
        return events

    def error_event(self, error: ApiError) -> dict:
        """A failure after the stream began (an adapter that would not load, say)."""
        return self._event("error", code=error.code, message=error.message, param=error.param)

    def body(self) -> dict[str, Any]:
        """The response object as it stands."""
        request = self.request
        body: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": self.status,
            "completed_at": self.completed_at,
            "error": _ABORTED if self.status == "failed" else None,
            "incomplete_details": {"reason": "max_output_tokens"}
            if self.status == "incomplete"
            else None,
            "instructions": request.instructions,
            "max_output_tokens": request.max_tokens,
            "model": request.model,
            "output": [dict(item) for item in self.output],
            "parallel_tool_calls": request.parallel_tool_calls,
            "previous_response_id": request.previous_response_id,
            "reasoning": {"effort": None, "summary": None},
            "store": request.store,
            "temperature": request.temperature,
            "text": request.text,
            "tool_choice": request.tool_choice,
            "tools": request.tools,
            "top_p": request.top_p,
            "truncation": "disabled",
            "metadata": request.metadata,
            "background": False,
            "service_tier": "default",
        }
        if self.usage is not None:
            body["usage"] = self.usage
        return body

    def _text(self, text: str) -> list[dict]:
        events = [] if self._is_open("message") else self._close("completed") + self._open_message()
        assert self._open is not None
        part = self._open["content"][0]
        part["text"] += text
        events.append(
            self._event(
                "response.output_text.delta",
                **self._at(self._open),
                content_index=0,
                delta=text,
                logprobs=[],
            )
        )
        return events

    def _call(self, entry: dict) -> list[dict]:
        """A chat tool-call stream entry: one with an `id` starts a call, one without adds to
        the arguments of the call at its `index`."""
        events: list[dict] = []
        function = entry.get("function") or {}
        if "id" in entry:
            events += self._close("completed")
            item: dict[str, Any] = {
                "id": _new_id("fc"),
                "type": "function_call",
                "status": "in_progress",
                "call_id": entry["id"],
                "name": function["name"],
                "arguments": "",
            }
            self._calls[entry["index"]] = item
            events += self._add_item(item)
        item = self._calls[entry["index"]]
        if function.get("arguments"):
            item["arguments"] += function["arguments"]
            events.append(
                self._event(
                    "response.function_call_arguments.delta",
                    **self._at(item),
                    delta=function["arguments"],
                )
            )
        return events

    def _open_message(self) -> list[dict]:
        item: dict[str, Any] = {
            "id": _new_id("msg"),
            "type": "message",
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        events = self._add_item(item)
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        item["content"].append(part)
        events.append(
            self._event(
                "response.content_part.added", **self._at(item), content_index=0, part=dict(part)
            )
        )
        return events

    def _add_item(self, item: dict) -> list[dict]:
        self._positions[item["id"]] = len(self.output)
        self.output.append(item)
        self._open = item
        return [
            self._event(
                "response.output_item.added",
                output_index=len(self.output) - 1,
                item=json.loads(json.dumps(item)),
            )
        ]

    def _close(self, status: str) -> list[dict]:
        item, self._open = self._open, None
        if item is None:
            return []
        item["status"] = status
        at = self._at(item)
        if item["type"] == "message":
            part = item["content"][0]
            events = [
                self._event(
                    "response.output_text.done",
                    **at,
                    content_index=0,
                    text=part["text"],
                    logprobs=[],
                ),
                self._event("response.content_part.done", **at, content_index=0, part=dict(part)),
            ]
        else:
            events = [
                self._event(
                    "response.function_call_arguments.done",
                    **at,
                    name=item["name"],
                    arguments=item["arguments"],
                )
            ]
        events.append(
            self._event(
                "response.output_item.done",
                output_index=at["output_index"],
                item=json.loads(json.dumps(item)),
            )
        )
        return events

    def _is_open(self, kind: str) -> bool:
        return self._open is not None and self._open["type"] == kind

    def _at(self, item: dict) -> dict:
        return {"item_id": item["id"], "output_index": self._positions[item["id"]]}

    def _event(self, kind: str, **fields) -> dict:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event
