"""Chat messages as callers write them (OpenAI's form), checked and put in the form chat
templates read (Hugging Face's).

One reading for every way a conversation reaches the engine: the chat API, the quality
gate's scoring rows and the registry's eval sets, so a row that passes upload also runs.
Every refusal is an `InvalidMessagesError` naming the field at fault.
"""

import json
from typing import Any

from .errors import InvalidMessagesError

TEXT_ROLES = frozenset({"system", "developer", "user", "assistant"})
CHAT_ROLES = TEXT_ROLES | {"tool"}
_FIELDS = frozenset({"role", "content", "name"})
_ASSISTANT_FIELDS = _FIELDS | {"tool_calls", "refusal"}
_TOOL_FIELDS = frozenset({"role", "content", "tool_call_id"})

Message = dict[str, Any]


def parse_messages(messages: object, *, with_tools: bool = False) -> list[Message]:
    """`with_tools`: assistant messages may carry `tool_calls`, and `tool` messages answer
    them (each right after the calls it answers, as OpenAI requires)."""
    _require(
        isinstance(messages, list) and bool(messages),
        "messages must be a non-empty list.",
        "messages",
    )
    assert isinstance(messages, list)
    roles = CHAT_ROLES if with_tools else TEXT_ROLES
    parsed: list[Message] = []
    pending: set[str] = set()  # ids of the latest tool calls no tool message answered yet
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        entry = _parse_message(message, where, roles, pending, with_tools=with_tools)
        if entry["role"] != "tool":
            pending = {call["id"] for call in entry.get("tool_calls", [])}
        parsed.append(entry)
    _require(
        parsed[-1]["role"] != "assistant" or len(parsed) > 1,
        "messages must hold at least one system or user message.",
        "messages",
    )
    return parsed


def _parse_message(
    message: object, where: str, roles: frozenset[str], pending: set[str], *, with_tools: bool
) -> Message:
    _require(isinstance(message, dict), f"{where} must be an object.", where)
    assert isinstance(message, dict)
    role = message.get("role")
    _require(
        isinstance(role, str) and role in roles,
        f"{where}.role must be one of {', '.join(sorted(roles))}; got {role!r}.",
        f"{where}.role",
    )
    if role == "tool":
        return _parse_tool_result(message, where, pending)
    if role == "assistant" and with_tools:
        _refuse_extra_fields(message, _ASSISTANT_FIELDS, where)
        return _parse_assistant(message, where)
    _refuse_extra_fields(message, _FIELDS, where)
    content = _message_text(message.get("content"), where)
    if role != "assistant":
        _require(bool(content.strip()), f"{where}.content must not be empty.", f"{where}.content")
    return {"role": "system" if role == "developer" else role, "content": content}


def _parse_assistant(message: Message, where: str) -> Message:
    """An assistant turn; its `tool_calls` go to the chat template as Hugging Face's templates
    read them: each call's `arguments` an object, not OpenAI's JSON string."""
    refusal = message.get("refusal")
    _require(
        refusal is None or isinstance(refusal, str),
        f"{where}.refusal must be a string or null.",
        f"{where}.refusal",
    )
    calls = _parse_tool_calls(message.get("tool_calls"), where)
    content = message.get("content")
    text = "" if content is None and calls else _message_text(content, where)
    return {"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})}


def _parse_tool_calls(calls: object, where: str) -> list[Message]:
    if calls is None:
        return []
    _require(isinstance(calls, list), f"{where}.tool_calls must be a list.", f"{where}.tool_calls")
    assert isinstance(calls, list)
    return [_parse_tool_call(call, f"{where}.tool_calls[{j}]") for j, call in enumerate(calls)]


def _parse_tool_call(call: object, at: str) -> Message:
    function = call.get("function") if isinstance(call, dict) else None
    _require(
        isinstance(call, dict)
        and set(call) == {"id", "type", "function"}
        and call["type"] == "function"
        and isinstance(call["id"], str)
        and bool(call["id"])
        and isinstance(function, dict)
        and set(function) == {"name", "arguments"}
        and isinstance(function["name"], str)
        and isinstance(function["arguments"], str),
        f'{at} must be {{"id": str, "type": "function", "function": {{"name": str, '
        '"arguments": str}}}.',
        at,
    )
    assert isinstance(call, dict) and isinstance(function, dict)  # checked above
    try:
        arguments = json.loads(function["arguments"])
    except ValueError:
        arguments = None
    _require(
        isinstance(arguments, dict),
        f"{at}.function.arguments must be a JSON object, as a string.",
        f"{at}.function.arguments",
    )
    return {
        "id": call["id"],
        "type": "function",
        "function": {"name": function["name"], "arguments": arguments},
    }


def _parse_tool_result(message: Message, where: str, pending: set[str]) -> Message:
    """A tool's answer to one of the calls of the assistant message just before."""
    _refuse_extra_fields(message, _TOOL_FIELDS, where)
    call_id = message.get("tool_call_id")
    if not (isinstance(call_id, str) and call_id in pending):
        raise InvalidMessagesError(
            f"{where}.tool_call_id must name a tool call of the assistant message before it "
            f"that no tool message answered yet; got {call_id!r}.",
            param=f"{where}.tool_call_id",
        )
    pending.discard(call_id)
    content = _message_text(message.get("content"), where)
    return {"role": "tool", "content": content, "tool_call_id": call_id}


def _message_text(content: object, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            ok = (
                isinstance(part, dict)
                and part.get("type") == "text"
                and isinstance(part.get("text"), str)
            )
            _require(
                ok,
                f"{where}.content[{j}] must be a text part; only text is supported.",
                f"{where}.content",
            )
            texts.append(part["text"])
        return "".join(texts)
    raise InvalidMessagesError(
        f"{where}.content must be a string or a list of text parts.", param=f"{where}.content"
    )


def _refuse_extra_fields(value: Message, allowed: frozenset[str], where: str) -> None:
    extra = sorted(map(str, set(value) - allowed))
    if extra:
        raise InvalidMessagesError(
            f"{where} has unsupported field(s): {', '.join(extra)}.", param=where
        )


def _require(ok: bool, message: str, param: str) -> None:
    if not ok:
        raise InvalidMessagesError(message, param=param)
