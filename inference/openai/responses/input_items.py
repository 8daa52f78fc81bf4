"""`input` as the Responses API takes it (a text, or a list of items), checked and put in one
plain form, then read as chat messages for the model's template.

Items are kept in that plain form (what a stored response's conversation holds): messages
with their text, `function_call` items (the model's calls) and `function_call_output` items
(the caller's results). A client sends back the output items it received (ids, statuses,
annotations and all), so those fields are accepted and dropped. Every refusal names the
item's field, `input[i].content[j].type` say.
"""

import json
from typing import Any

from inference.errors import ProtocolError, UnsupportedParameter

from ..fields import refuse_extra_fields
from ..protocol import parse_chat_messages

Item = dict[str, Any]

ROLES = ("user", "system", "developer", "assistant")
_MESSAGE_FIELDS = {"type", "role", "content", "id", "status", "phase"}
_CALL_FIELDS = {"type", "call_id", "name", "arguments", "id", "status"}
_OUTPUT_FIELDS = {"type", "call_id", "output", "id", "status"}
# The text parts each side writes; an assistant's own output parts come back as they went out.
_INPUT_PART = {"input_text": {"type", "text"}}
_ASSISTANT_PARTS = {
    "output_text": {"type", "text", "annotations", "logprobs"},
    "input_text": {"type", "text"},
    "refusal": {"type", "refusal"},
}
# Items of OpenAI's that need what this server does not have (its tools, its stored items).
_UNSUPPORTED_ITEMS = {
    "item_reference": "item references are not supported: send the item itself, or continue "
    "a stored response with previous_response_id",
    "reasoning": "reasoning items are not supported: this server's models do not reason apart "
    "from their answer",
}


def parse_input(value) -> list[Item]:
    """The request's items in their plain form."""
    if isinstance(value, str):
        if not value.strip():
            raise ProtocolError("input must not be empty.", param="input")
        return [_message("user", value)]
    if not (isinstance(value, list) and value):
        raise ProtocolError(
            "input is required: a text, or a non-empty list of input items.", param="input"
        )
    return [parse_item(item, f"input[{i}]") for i, item in enumerate(value)]


def parse_item(item, where: str) -> Item:
    if not isinstance(item, dict):
        raise ProtocolError(f"{where} must be an object (an input item).", param=where)
    kind = item.get("type", "message" if "role" in item else None)
    kind = kind if isinstance(kind, str) else None
    if kind == "message":
        return _parse_message(item, where)
    if kind == "function_call":
        return _parse_call(item, where)
    if kind == "function_call_output":
        return _parse_output(item, where)
    if kind in _UNSUPPORTED_ITEMS:
        raise UnsupportedParameter(
            f"{where}.type {kind!r}: {_UNSUPPORTED_ITEMS[kind]}.", param=f"{where}.type"
        )
    raise UnsupportedParameter(
        f"{where}.type must be message, function_call or function_call_output (the items of "
        f"text conversations with function tools); got {kind!r}.",
        param=f"{where}.type",
    )


def _message(role: str, text: str) -> Item:
    part = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": part, "text": text}]}


def _parse_message(item: dict, where: str) -> Item:
    refuse_extra_fields(item, _MESSAGE_FIELDS, where)
    role = item.get("role")
    if role not in ROLES:
        raise ProtocolError(
            f"{where}.role must be one of {', '.join(ROLES)}; got {role!r}.", param=f"{where}.role"
        )
    if item.get("phase") is not None:
        raise UnsupportedParameter(
            f"{where}.phase is not supported (this server's answers have one phase).",
            param=f"{where}.phase",
        )
    text = _content_text(item.get("content"), role, f"{where}.content")
    if role != "assistant" and not text.strip():
        raise ProtocolError(f"{where}.content must not be empty.", param=f"{where}.content")
    return _message(role, text)


def _content_text(content, role: str, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ProtocolError(f"{where} must be a string or a list of text parts.", param=where)
    parts = _ASSISTANT_PARTS if role == "assistant" else _INPUT_PART
    texts = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if not (isinstance(kind, str) and kind in parts):
            raise UnsupportedParameter(
                f"{at} must be a part of type {' or '.join(parts)} (only text is supported); "
                f"got {kind!r}.",
                param=f"{at}.type",
            )
        refuse_extra_fields(part, parts[kind], at)
        key = "refusal" if kind == "refusal" else "text"
        if not isinstance(part.get(key), str):
            raise ProtocolError(f"{at}.{key} must be a string.", param=f"{at}.{key}")
        texts.append(part[key])
    return "".join(texts)


def _parse_call(item: dict, where: str) -> Item:
    refuse_extra_fields(item, _CALL_FIELDS, where)
    call_id = _require_text(item.get("call_id"), f"{where}.call_id")
    name = _require_text(item.get("name"), f"{where}.name")
    arguments = item.get("arguments")
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else None
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise ProtocolError(
            f"{where}.arguments must be a JSON object, as a string.", param=f"{where}.arguments"
        )
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments}


def _parse_output(item: dict, where: str) -> Item:
    refuse_extra_fields(item, _OUTPUT_FIELDS, where)
    call_id = _require_text(item.get("call_id"), f"{where}.call_id")
    output = _content_text(item.get("output"), "tool", f"{where}.output")
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def _require_text(value, param: str) -> str:
    if not (isinstance(value, str) and value):
        raise ProtocolError(f"{param} must be a non-empty string.", param=param)
    return value


def output_as_input(output: list[dict]) -> list[Item]:
    """A response's output items in the plain form of the conversation it continues. A call
    cut short by `max_output_tokens` (its arguments unfinished JSON) was never made: dropped."""
    items = []
    for i, item in enumerate(output):
        try:
            items.append(parse_item(item, f"output[{i}]"))
        except ProtocolError:
            continue
    return items


def chat_messages(
    items: list[Item], *, instructions: str | None = None, stored: int = 0
) -> list[dict]:
    """The conversation as chat messages for the template: `instructions` first, as a system
    message; consecutive calls one assistant turn (with the text before them); each output
    right after the turn whose call it answers. The first `stored` items come from the
    stored conversation (a refusal there names `previous_response_id`), the rest are
    `input[i - stored]`."""

    def where(j: int) -> str:
        return "previous_response_id" if j < stored else f"input[{j - stored}]"

    messages: list[dict] = []
    sources: list[int | None] = []  # the item each message starts at (None: instructions)
    if instructions:
        messages.append({"role": "system", "content": instructions})
        sources.append(None)
    pending: set[str] = set()  # the latest turn's calls no output answered yet
    for j, item in enumerate(items):
        kind = item["type"]
        if kind == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            if messages and messages[-1]["role"] == "assistant":
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
                sources.append(j)
                pending = set()
            pending.add(item["call_id"])
            continue
        if kind == "function_call_output":
            if item["call_id"] not in pending:
                raise ProtocolError(
                    f"{where(j)}.call_id {item['call_id']!r} names no function_call of the turn "
                    "before it that no function_call_output answered yet.",
                    param=f"{where(j)}.call_id" if j >= stored else where(j),
                )
            pending.discard(item["call_id"])
            messages.append(
                {"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]}
            )
        else:
            text = "".join(part["text"] for part in item["content"])
            messages.append({"role": item["role"], "content": text})
            pending = set()
        sources.append(j)
    try:
        return parse_chat_messages(messages, with_tools=True)
    except ProtocolError as exc:  # the template's rules beyond the items' own
        raise _named_after_items(exc, sources, where) from None


def _named_after_items(exc: ProtocolError, sources: list[int | None], where) -> ProtocolError:
    """The chat reader names `messages[i]`; the caller wrote items."""
    param = exc.param or ""
    if not param.startswith("messages["):
        return ProtocolError(exc.message.replace("messages", "input"), param="input")
    index = int(param[len("messages[") : param.index("]")])
    source = sources[index]
    named = "instructions" if source is None else where(source)
    message = exc.message.replace(f"messages[{index}]", named)
    return ProtocolError(message, param=named)
