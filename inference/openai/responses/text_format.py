"""`text` in the Responses API: `format` is the chat API's `response_format` laid flat
(`{"type": "json_schema", "name", "schema", "strict"}`), read through response_format.py, so
both APIs hold an answer to a schema the same way."""

from inference.errors import ProtocolError, UnsupportedParameter

from ..constraints import JsonConstraint
from ..fields import refuse_extra_fields
from ..response_format import parse_response_format
from ..schema_limits import SchemaBudget

PARAM = "text.format"
_SCHEMA_FIELDS = ("name", "schema", "strict", "description")
DEFAULT_TEXT = {"format": {"type": "text"}, "verbosity": "medium"}


def parse_text(value, budget: SchemaBudget) -> tuple[JsonConstraint | None, dict]:
    """The answer's constraint (None: plain text), and `text` as the response echoes it."""
    if value is None:
        return None, dict(DEFAULT_TEXT)
    if not isinstance(value, dict):
        raise ProtocolError("text must be an object with a format.", param="text")
    refuse_extra_fields(value, {"format", "verbosity"}, "text")
    if value.get("verbosity") not in (None, "medium"):
        raise UnsupportedParameter(
            "text.verbosity is not supported by this server (only medium, the default).",
            param="text.verbosity",
        )
    fmt = value.get("format")
    if fmt is None:
        return None, dict(DEFAULT_TEXT)
    if not isinstance(fmt, dict):
        raise ProtocolError(
            f"{PARAM} must be an object whose type is text, json_object or json_schema.",
            param=PARAM,
        )
    kind = fmt.get("type")
    if kind == "json_schema":
        refuse_extra_fields(fmt, {"type", *_SCHEMA_FIELDS}, PARAM)
        nested = {key: fmt[key] for key in _SCHEMA_FIELDS if key in fmt}
        chat_format = {"type": "json_schema", "json_schema": nested}
    else:
        chat_format = fmt
    try:
        constraint = parse_response_format(chat_format, budget)
    except ProtocolError as exc:
        raise type(exc)(_flat(exc.message), param=_flat(exc.param or PARAM)) from None
    if constraint is not None:
        constraint = JsonConstraint(constraint.schema, _flat(constraint.param))
    return constraint, {"format": fmt, "verbosity": "medium"}


def _flat(text: str) -> str:
    return text.replace("response_format.json_schema", PARAM).replace("response_format", PARAM)
