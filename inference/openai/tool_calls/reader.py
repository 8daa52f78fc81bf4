"""What every tool-call reader shares: the calls so far and the content, as OpenAI streams
them (one `Delta` per text delta)."""

import uuid
from dataclasses import dataclass, field
from typing import Any


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@dataclass
class Delta:
    """What one text delta adds to the message: content text and tool-call stream entries."""

    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    def __iadd__(self, other: "Delta") -> "Delta":
        self.content += other.content
        self.tool_calls += other.tool_calls
        return self


class CallReader:
    """Shared bookkeeping: the calls so far (OpenAI's `tool_calls` objects) and the content."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.content_text = ""

    def feed(self, text: str) -> Delta:
        raise NotImplementedError

    def finish(self) -> Delta:
        """The end of the choice's text: whatever was held back."""
        return Delta()

    @property
    def content(self) -> str | None:
        """The message's `content`: null beside tool calls when the model wrote nothing else."""
        return self.content_text if self.content_text or not self.calls else None

    def finish_reason(self, engine_reason: str | None) -> str | None:
        """`tool_calls` when the answer ended by itself with calls in it."""
        return "tool_calls" if self.calls and engine_reason == "stop" else engine_reason

    def _content(self, text: str) -> Delta:
        self.content_text += text
        return Delta(content=text)

    def _complete_call(self, name: str, arguments: str) -> Delta:
        """A whole call at once: one stream entry with its id, name and arguments."""
        function = {"name": name, "arguments": arguments}
        call = {"id": new_call_id(), "type": "function", "function": function}
        self.calls.append(call)
        entry = {"index": len(self.calls) - 1, **call, "function": dict(function)}
        return Delta(tool_calls=[entry])
