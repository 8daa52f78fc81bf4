"""tool_choice "required": the text is a JSON array of `{"name", "arguments"}`; each call is
sent once its element is complete."""

import json

from .reader import CallReader, Delta


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
