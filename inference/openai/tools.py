"""`tools`, `tool_choice` and `parallel_tool_calls` on chat requests: what they may hold, what
the chat template is shown, and the JSON a forced call is held to.

- `tool_choice: "none"`: the tools are checked but neither shown to the model nor looked for
  in its answer, which is plain content (OpenAI: the model calls no tool).
- `"auto"` (the default with tools): the template shows the tools; calls the model writes in
  its answer are parsed out of it (tool_calls/).
- `"required"`: the answer is held to a JSON array of one or more `{"name", "arguments"}`
  calls, each `arguments` valid against its tool's `parameters` (at most one call with
  `parallel_tool_calls: false`).
- `{"type": "function", "function": {"name": ...}}`: the answer is held to that tool's
  `parameters`: it is the call's arguments.
"""

from dataclasses import dataclass
from typing import Any

from inference.errors import ProtocolError

from .constraints import JsonConstraint, require_json_schema, require_name
from .fields import refuse_extra_fields
from .schema_limits import SchemaBudget

MAX_TOOLS = 128  # OpenAI's limit
MODES = ("none", "auto", "required")
# A function without `parameters` takes none (OpenAI's reading).
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class Tool:
    name: str
    parameters: dict[str, Any]  # the JSON Schema of its arguments, an object
    definition: dict[str, Any]  # what the chat template sees: {"type": "function", "function"}


@dataclass(frozen=True)
class ToolUse:
    """The tools of a request whose `tool_choice` is not "none"."""

    tools: tuple[Tool, ...]
    mode: str  # "auto", "required" or "function"
    function: str | None = None  # the forced function's name, mode "function"
    parallel: bool = True  # parallel_tool_calls

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(tool.name for tool in self.tools)

    def template_tools(self) -> list[dict[str, Any]]:
        """The `tools` a chat template renders (Hugging Face's convention)."""
        return [tool.definition for tool in self.tools]

    def forced_constraint(self) -> JsonConstraint | None:
        """The JSON a forced call's answer must be; None when the model chooses (auto)."""
        if self.mode == "function":
            i = self.names.index(self.function)
            return JsonConstraint(self.tools[i].parameters, f"tools[{i}].function.parameters")
        if self.mode != "required":
            return None
        call = {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "enum": [tool.name]},
                        "arguments": tool.parameters,
                    },
                    "required": ["name", "arguments"],
                    "additionalProperties": False,
                }
                for tool in self.tools
            ]
        }
        schema: dict[str, Any] = {"type": "array", "items": call, "minItems": 1}
        if not self.parallel:
            schema["maxItems"] = 1
        return JsonConstraint(schema, "tools")


def parse_tool_use(body: dict, budget: SchemaBudget | None = None) -> ToolUse | None:
    """The request's tool use, or None when the model is to answer in plain content (no tools,
    or `tool_choice: "none"`). Every tool is checked either way."""
    tools = _parse_tools(body.get("tools"), budget or SchemaBudget())
    names = [tool.name for tool in tools]
    choice = body.get("tool_choice")
    mode, function = _parse_tool_choice(choice, names)
    parallel = body.get("parallel_tool_calls")
    if parallel not in (None, True, False):
        raise ProtocolError("parallel_tool_calls must be a boolean.", param="parallel_tool_calls")
    if not tools:
        if mode in ("required", "function"):
            raise ProtocolError(
                "tool_choice asks for a tool call, but the request has no tools.",
                param="tool_choice",
            )
        return None
    if mode == "none":
        return None
    return ToolUse(tuple(tools), mode, function, parallel is not False)


def _parse_tools(value, budget: SchemaBudget) -> list[Tool]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ProtocolError("tools must be a list of function tools.", param="tools")
    if len(value) > MAX_TOOLS:
        raise ProtocolError(f"tools takes at most {MAX_TOOLS} tools.", param="tools")
    tools = [_parse_tool(item, f"tools[{i}]", budget) for i, item in enumerate(value)]
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        if tool.name in seen:
            raise ProtocolError(
                f"tools[{i}].function.name {tool.name!r} is given twice; names must be unique.",
                param=f"tools[{i}].function.name",
            )
        seen.add(tool.name)
    return tools


def _parse_tool(item, where: str, budget: SchemaBudget) -> Tool:
    if not isinstance(item, dict) or item.get("type") != "function":
        raise ProtocolError(
            f'{where} must be an object with "type": "function" and a function.', param=where
        )
    refuse_extra_fields(item, {"type", "function"}, where)
    function = item.get("function")
    where = f"{where}.function"
    if not isinstance(function, dict):
        raise ProtocolError(f"{where} must be an object with a name.", param=where)
    refuse_extra_fields(function, {"name", "description", "parameters", "strict"}, where)
    name = require_name(function.get("name"), f"{where}.name")
    if not isinstance(function.get("description", ""), str):
        raise ProtocolError(f"{where}.description must be a string.", param=f"{where}.description")
    if function.get("strict") not in (None, True, False):
        raise ProtocolError(f"{where}.strict must be a boolean.", param=f"{where}.strict")
    parameters = NO_PARAMETERS
    if function.get("parameters") is not None:
        parameters = require_json_schema(function["parameters"], f"{where}.parameters", budget)
        if parameters.get("type") != "object":
            raise ProtocolError(
                f'{where}.parameters must be a JSON Schema with "type": "object": a call\'s '
                "arguments are an object.",
                param=f"{where}.parameters",
            )
    definition = {"type": "function", "function": {**function, "parameters": parameters}}
    return Tool(name=name, parameters=parameters, definition=definition)


def _parse_tool_choice(choice, names: list[str]) -> tuple[str, str | None]:
    """(mode, forced function name). The default is "auto", as OpenAI's with tools."""
    if choice is None:
        return "auto", None
    if isinstance(choice, str):
        if choice not in MODES:
            raise ProtocolError(
                f'tool_choice must be one of {", ".join(MODES)} or {{"type": "function", '
                f'"function": {{"name": ...}}}}; got {choice!r}.',
                param="tool_choice",
            )
        return choice, None
    function = choice.get("function") if isinstance(choice, dict) else None
    if not (
        isinstance(choice, dict)
        and choice.get("type") == "function"
        and isinstance(function, dict)
        and set(choice) == {"type", "function"}
        and set(function) == {"name"}
    ):
        raise ProtocolError(
            'tool_choice must be "none", "auto", "required" or {"type": "function", '
            '"function": {"name": ...}}.',
            param="tool_choice",
        )
    name = function["name"]
    if name not in names:
        raise ProtocolError(
            f"tool_choice names the function {name!r}, which is not among the tools.",
            param="tool_choice",
        )
    return "function", name
