"""Tool calls read out of a choice's text as it streams, one reader per choice.

A reader takes the choice's text delta by delta and says what of it is `content` and which
tool calls it completed, in OpenAI's stream shapes; at the end it has the whole message's
`content` and `tool_calls`. Streamed or not, a request reads the same way, so the deltas a
client accumulates equal the message a non-streamed request returns.

- `ForcedFunctionReader` (tool_choice names a function): the whole text is the arguments,
  streamed as they come.
- `RequiredCallsReader` (tool_choice "required"): the text is a JSON array of `{"name",
  "arguments"}`; each call is sent once its element is complete.
- `AutoCallsReader` (tool_choice "auto"): the model chose. Calls are Hermes/Qwen blocks
  (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number, text around them
  stays content) or, when the whole answer is JSON, Llama 3.1's `{"name": ...,
  "parameters": {...}}` (or a list of them). A block that is not a call of one of the
  request's tools stays content, as written.
"""

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from .tools import ToolUse

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"


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


class ForcedFunctionReader(CallReader):
    """The text is the forced function's arguments: an entry naming the call, then each
    delta as an arguments fragment."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def feed(self, text: str) -> Delta:
        if not text:
            return Delta()
        if not self.calls:
            delta = self._complete_call(self.name, "")
            delta.tool_calls[0]["function"]["arguments"] = text
            self.calls[0]["function"]["arguments"] = text
            return delta
        self.calls[0]["function"]["arguments"] += text
        return Delta(tool_calls=[{"index": 0, "function": {"arguments": text}}])

    def finish_reason(self, engine_reason: str | None) -> str | None:
        """A stop string can end the text before its JSON does: then it is not a call."""
        if engine_reason == "stop" and self.calls:
            try:
                json.loads(self.calls[0]["function"]["arguments"])
            except ValueError:
                return engine_reason
        return super().finish_reason(engine_reason)


class RequiredCallsReader(CallReader):
    """The text is a JSON array of calls (the forced schema guarantees it); each element is
    found by tracking nesting and strings, and sent once it closes."""

    def __init__(self, names: tuple[str, ...]) -> None:
        super().__init__()
        self.names = names
        self._text = ""
        self._scanned = 0
        self._depth = 0
        self._in_string = False
        self._escaped = False
        self._element_start: int | None = None

    def feed(self, text: str) -> Delta:
        self._text += text
        delta = Delta()
        for i in range(self._scanned, len(self._text)):
            element = self._scan(i, self._text[i])
            if element is not None:
                delta += self._call_from(element)
        self._scanned = len(self._text)
        return delta

    def _scan(self, i: int, char: str) -> str | None:
        """Advance over one character; the text of an array element it closes, if any."""
        if self._in_string:
            if self._escaped:
                self._escaped = False
            elif char == "\\":
                self._escaped = True
            elif char == '"':
                self._in_string = False
            return None
        if char == '"':
            self._in_string = True
        elif char in "[{":
            self._depth += 1
            if self._depth == 2:
                self._element_start = i
        elif char in "]}":
            self._depth -= 1
            if self._depth == 1 and self._element_start is not None:
                start, self._element_start = self._element_start, None
                return self._text[start : i + 1]
        return None

    def finish(self) -> Delta:
        if self._element_start is not None:  # cut short (max_tokens): the unfinished call
            return self._content(self._text[self._element_start :])
        return Delta() if self.calls else self._content(self._text)

    def _call_from(self, element: str) -> Delta:
        try:
            item = json.loads(element)
        except ValueError:
            item = None
        if not (
            isinstance(item, dict)
            and item.get("name") in self.names
            and isinstance(item.get("arguments"), dict)
        ):
            return self._content(element)  # the schema rules this out; never drop text
        return self._complete_call(item["name"], json.dumps(item["arguments"], ensure_ascii=False))


class AutoCallsReader(CallReader):
    """Content streams as it comes, except what may be the start of a `<tool_call>` tag (held
    until it is known) and whitespace around calls (sent only when more content follows).
    An answer that starts with `{` or `[` is held whole: it may be a Llama-style JSON call."""

    def __init__(self, names: tuple[str, ...], parallel: bool = True) -> None:
        super().__init__()
        self.names = names
        self.parallel = parallel
        self._pending = ""  # text not yet classified
        self._spaces = ""  # whitespace held after content, sent if more content follows
        self._in_call = False
        self._mode: str | None = None  # None until the first non-space: "json" or "tags"

    def feed(self, text: str) -> Delta:
        self._pending += text
        if self._mode is None:
            start = self._pending.lstrip()
            if not start:
                return Delta()
            self._mode = "json" if start[0] in "{[" else "tags"
        return Delta() if self._mode == "json" else self._read_tags()

    def finish(self) -> Delta:
        if self._mode == "json":
            return self._read_json(self._pending)
        delta = self._read_tags()
        rest = (OPEN_TAG if self._in_call else "") + self._pending
        self._pending = ""
        delta += self._text(rest)
        if not self.calls and self._spaces:  # no calls: the text stays exactly as written
            delta += self._content(self._spaces)
        self._spaces = ""
        return delta

    def _read_tags(self) -> Delta:
        delta = Delta()
        while True:
            if self._in_call:
                end = self._pending.find(CLOSE_TAG)
                if end < 0:
                    return delta
                body, self._pending = self._pending[:end], self._pending[end + len(CLOSE_TAG) :]
                self._in_call = False
                call = self._parse_call(body)
                if call is None:
                    delta += self._text(OPEN_TAG + body + CLOSE_TAG)
                else:
                    self._spaces = ""  # the whitespace around a call is not content
                    delta += self._complete_call(*call)
                continue
            start = self._pending.find(OPEN_TAG)
            if start < 0:
                keep = _partial_tag_length(self._pending)
                cut = len(self._pending) - keep
                delta += self._text(self._pending[:cut])
                self._pending = self._pending[cut:]
                return delta
            delta += self._text(self._pending[:start])
            self._pending = self._pending[start + len(OPEN_TAG) :]
            self._in_call = True

    def _text(self, text: str) -> Delta:
        """Content, with trailing whitespace held back until more content follows it."""
        if not text:
            return Delta()
        text = self._spaces + text
        body = text.rstrip()
        self._spaces = text[len(body) :]
        return self._content(body) if body else Delta()

    def _parse_call(self, body: str) -> tuple[str, str] | None:
        if self.calls and not self.parallel:
            return None  # parallel_tool_calls: false: the first call only
        try:
            item = json.loads(body)
        except ValueError:
            return None
        return self._call_of(item, "arguments")

    def _call_of(self, item, arguments_key: str) -> tuple[str, str] | None:
        if not isinstance(item, dict) or item.get("name") not in self.names:
            return None
        arguments = item.get(arguments_key)
        if not isinstance(arguments, dict):
            return None
        return item["name"], json.dumps(arguments, ensure_ascii=False)

    def _read_json(self, text: str) -> Delta:
        """Llama 3.1's JSON calls: the whole answer one object, or a list of them, each
        `{"name", "parameters"}` (or `"arguments"`). Anything else is content."""
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        items = parsed if isinstance(parsed, list) and parsed else [parsed]
        calls = [
            self._call_of(item, "parameters" if "parameters" in item else "arguments")
            if isinstance(item, dict)
            else None
            for item in items
        ]
        if any(call is None for call in calls) or (len(calls) > 1 and not self.parallel):
            return self._content(text)
        delta = Delta()
        for call in calls:
            assert call is not None
            delta += self._complete_call(*call)
        return delta


def _partial_tag_length(text: str) -> int:
    """How many characters at the end of `text` could begin an opening tag."""
    for length in range(min(len(OPEN_TAG) - 1, len(text)), 0, -1):
        if OPEN_TAG.startswith(text[-length:]):
            return length
    return 0


def call_reader(use: ToolUse | None) -> CallReader | None:
    """A fresh reader for one choice of a request with tools; None without."""
    if use is None:
        return None
    if use.mode == "function":
        assert use.function is not None
        return ForcedFunctionReader(use.function)
    if use.mode == "required":
        return RequiredCallsReader(use.names)
    return AutoCallsReader(use.names, parallel=use.parallel)
