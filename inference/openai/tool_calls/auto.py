"""tool_choice "auto": the model chose. Calls are Hermes/Qwen blocks (`<tool_call>{"name": ...,
"arguments": {...}}</tool_call>`, any number, text around them stays content) or, when the
whole answer is JSON, Llama 3.1's `{"name": ..., "parameters": {...}}` (or a list of them). A
block that is not a call of one of the request's tools stays content, as written."""

import json

from .reader import CallReader, Delta

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"


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
