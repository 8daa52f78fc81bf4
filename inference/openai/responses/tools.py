"""`tools`, `tool_choice` and `parallel_tool_calls` in the Responses API's shapes, read through
the chat API's tool use (../tools.py): a function tool here is flat (`{"type": "function",
"name", "parameters"}`), a forced one `{"type": "function", "name"}`. OpenAI's built-in tools
(web search, file search, computer use, MCP, ...) run on OpenAI's side; this server has
none of them, so each is refused by name."""

from typing import Any

from inference.errors import ProtocolError, UnsupportedParameter

from ..constraints import JsonConstraint
from ..fields import refuse_extra_fields
from ..schema_limits import SchemaBudget
from ..tools import MODES, ToolUse, parse_tool_use

_FUNCTION_FIELDS = {
    "type",
    "name",
    "description",
    "parameters",
    "strict",
    "defer_loading",
    "output_schema",
    "allowed_callers",
}
# Fields of a function tool accepted only at their neutral value.
_NEUTRAL_FIELDS: dict[str, tuple] = {
    "defer_loading": (False,),  # deferred tools belong to OpenAI's tool search
    "output_schema": (),
    "allowed_callers": (),
}


def parse_tools(body: dict, budget: SchemaBudget) -> tuple[ToolUse | None, list[dict]]:
    """The request's tool use (None: the model answers in text), and the tools as the
    response echoes them."""
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise ProtocolError("tools must be a list of function tools.", param="tools")
    echoed = [_flat_function(tool, f"tools[{i}]") for i, tool in enumerate(tools or [])]
    chat_body = {
        "tools": [_chat_tool(tool) for tool in echoed],
        "tool_choice": _chat_tool_choice(body.get("tool_choice")),
        "parallel_tool_calls": body.get("parallel_tool_calls"),
    }
    try:
        use = parse_tool_use(chat_body, budget)
    except ProtocolError as exc:
        raise flat_names(exc) from None
    return use, echoed


def forced_constraint(use: ToolUse) -> JsonConstraint | None:
    """The chat reading's forced-call constraint, naming the fields as this API has them."""
    constraint = use.forced_constraint()
    if constraint is None:
        return None
    return JsonConstraint(constraint.schema, _flat(constraint.param))


def _flat_function(tool, where: str) -> dict[str, Any]:
    kind = tool.get("type") if isinstance(tool, dict) else None
    if kind != "function":
        raise UnsupportedParameter(
            f"{where}.type must be function: this server runs no built-in tools "
            f"(got {kind!r}); describe the tool as a function and run it yourself.",
            param=f"{where}.type" if isinstance(tool, dict) else where,
        )
    refuse_extra_fields(tool, _FUNCTION_FIELDS, where)
    for name, neutral in _NEUTRAL_FIELDS.items():
        if tool.get(name) is not None and tool[name] not in neutral:
            raise UnsupportedParameter(
                f"{where}.{name} is not supported by this server.", param=f"{where}.{name}"
            )
    return {
        "type": "function",
        "name": tool.get("name"),
        **({"description": tool["description"]} if "description" in tool else {}),
        "parameters": tool.get("parameters"),
        "strict": tool.get("strict"),
    }


def _chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = {key: value for key, value in tool.items() if key != "type" and value is not None}
    return {"type": "function", "function": function}


def _chat_tool_choice(choice):
    if choice is None or isinstance(choice, str):
        return choice  # the modes are the chat API's; an unknown one is refused there
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "function" and isinstance(choice, dict):
        refuse_extra_fields(choice, {"type", "name"}, "tool_choice")
        if not isinstance(choice.get("name"), str):
            raise ProtocolError("tool_choice.name must be a function's name.", param="tool_choice")
        return {"type": "function", "function": {"name": choice["name"]}}
    if kind is not None:
        raise UnsupportedParameter(
            f"tool_choice of type {kind!r} is not supported: this server has function tools "
            f'only. Use {", ".join(MODES)} or {{"type": "function", "name": ...}}.',
            param="tool_choice",
        )
    raise ProtocolError(
        f'tool_choice must be one of {", ".join(MODES)} or {{"type": "function", "name": ...}}.',
        param="tool_choice",
    )


def flat_names(exc: ProtocolError) -> ProtocolError:
    """The chat reader names `tools[i].function.name`; here it is `tools[i].name`, and a
    forced function is `{"type": "function", "name": ...}`."""
    message = _flat(exc.message).replace('"function": {"name": ...}}', '"name": ...')
    return type(exc)(message, param=_flat(exc.param) if exc.param else None)


def _flat(text: str) -> str:
    return text.replace("].function.", "].").replace("].function", "]")
