"""tool_choice names a function: the whole text is the call's arguments, streamed as they
come."""

import json

from .reader import CallReader, Delta


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
