"""Tool calls read out of a choice's text as it streams, one reader per choice.

A reader takes the choice's text delta by delta and says what of it is `content` and which
tool calls it completed, in OpenAI's stream shapes; at the end it has the whole message's
`content` and `tool_calls`. Streamed or not, a request reads the same way, so the deltas a
client accumulates equal the message a non-streamed request returns. One reader a file:
forced.py (a named function), required.py ("required"), auto.py (the model chose).
"""

from ..tools import ToolUse
from .auto import AutoCallsReader
from .forced import ForcedFunctionReader
from .reader import CallReader, Delta, new_call_id
from .required import RequiredCallsReader

__all__ = [
    "AutoCallsReader",
    "CallReader",
    "Delta",
    "ForcedFunctionReader",
    "RequiredCallsReader",
    "call_reader",
    "new_call_id",
]


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
