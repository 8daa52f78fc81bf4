"""A Responses API request body -> what the shared generation flow needs, plus what the
response echoes and keeps. Pure parsing, no Django: every refusal names its field.

OpenAI's parameters this server cannot honour are refused rather than ignored (a client
learns at once that `background` or a reasoning effort does nothing here); those with no
effect on the answer (`user`, cache hints, `service_tier`) are accepted.
"""

from dataclasses import dataclass, field
from typing import Any

from inference.errors import ProtocolError, UnknownParameter, UnsupportedParameter

from ..protocol import MAX_COUNT, GenerationRequest
from ..schema_limits import SchemaBudget
from .input_items import Item, chat_messages, parse_input
from .text_format import parse_text
from .tools import forced_constraint, parse_tools

FIELDS = {
    "model",
    "input",
    "instructions",
    "max_output_tokens",
    "temperature",
    "top_p",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "text",
    "previous_response_id",
    "store",
    "stream",
    "stream_options",
    "metadata",
    "reasoning",
}
# No effect on the answer: accepted as OpenAI's are, and not used.
IGNORED_FIELDS = {
    "user",
    "safety_identifier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "prompt_cache_options",
    "service_tier",
}
# Accepted only at their neutral value: anything else asks for what this server lacks.
NEUTRAL: dict[str, tuple] = {
    "background": (False,),  # answers are given on the request that asked
    "include": ([],),  # no extra output data (logprobs, tool results) is available
    "top_logprobs": (0,),
    "truncation": ("disabled",),  # a conversation over the context is refused, not cut
    "max_tool_calls": (),
    "conversation": (),  # OpenAI's Conversations API; previous_response_id is supported
    "prompt": (),  # OpenAI's stored prompt templates
    "context_management": (),
    "moderation": (),
}
REASONING_FIELDS = {"effort", "summary", "generate_summary", "mode", "context"}
MAX_METADATA_PAIRS = 16  # OpenAI's bounds
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512


@dataclass
class ResponsesRequest(GenerationRequest):
    """The generation request, and what the Responses API adds around it."""

    input_items: list[Item] = field(default_factory=list)  # this request's, in plain form
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    metadata: dict[str, str] = field(default_factory=dict)
    tools: list[dict] = field(default_factory=list)  # as the response echoes them
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    text: dict = field(default_factory=dict)
    # The whole conversation the answer continues: the stored one, then `input_items`.
    conversation: list[Item] = field(default_factory=list)

    def continue_from(self, stored: list[Item]) -> None:
        """Prepend a stored response's conversation (its input, then its output); its
        `instructions` are not carried over, as OpenAI's are not."""
        self.conversation = stored + self.input_items
        self.messages = chat_messages(
            self.conversation, instructions=self.instructions, stored=len(stored)
        )


def parse_responses_request(body: dict) -> ResponsesRequest:
    _refuse_unsupported(body)
    model = body.get("model")
    if not (isinstance(model, str) and model.strip()):
        raise ProtocolError("model is required (a model name string).", param="model")
    request = ResponsesRequest(model=model.strip(), max_tokens_param="max_output_tokens")
    request.stream = _optional_bool(body, "stream", False)
    options = body.get("stream_options")
    _require(
        options is None or (isinstance(options, dict) and set(options) <= {"include_obfuscation"}),
        "stream_options may only hold include_obfuscation.",
        "stream_options",
    )
    _refuse_reasoning(body.get("reasoning"))
    request.instructions = _optional_text(body.get("instructions"), "instructions")
    request.input_items = parse_input(body.get("input"))
    request.previous_response_id = _optional_text(
        body.get("previous_response_id"), "previous_response_id"
    )
    request.store = _optional_bool(body, "store", True)
    request.metadata = _parse_metadata(body.get("metadata"))
    request.max_tokens = _optional_count(body.get("max_output_tokens"), "max_output_tokens")
    temperature = body.get("temperature")
    if temperature is not None:
        _require(
            _is_number(temperature) and 0 <= temperature <= 2,
            "temperature must be a number from 0 to 2.",
            "temperature",
        )
        request.temperature = float(temperature)
    top_p = body.get("top_p")
    if top_p is not None:
        _require(_is_number(top_p) and 0 < top_p <= 1, "top_p must be in (0, 1].", "top_p")
        request.top_p = float(top_p)
    budget = SchemaBudget()  # one for every schema the request holds
    request.tool_use, request.tools = parse_tools(body, budget)
    request.tool_choice = body.get("tool_choice") or "auto"
    request.parallel_tool_calls = body.get("parallel_tool_calls") is not False
    format_constraint, request.text = parse_text(body.get("text"), budget)
    if request.tool_use is not None and request.tool_use.mode == "auto" and format_constraint:
        raise ProtocolError(
            'text.format cannot be combined with tools when tool_choice is "auto": an answer '
            'held to a format leaves the model no way to call a tool. (With "required" or a '
            "named function the answer is the calls, and the format is not used.)",
            param="text.format",
        )
    forced = forced_constraint(request.tool_use) if request.tool_use else None
    request.constraint = forced or format_constraint
    if request.previous_response_id is None:
        request.continue_from([])
    return request


def _refuse_unsupported(body: dict) -> None:
    for name, value in body.items():
        if name in FIELDS or name in IGNORED_FIELDS:
            continue
        if name in NEUTRAL:
            if value is None or value in NEUTRAL[name]:
                continue
            raise UnsupportedParameter(
                f"The parameter '{name}' is not supported by this server.", param=name
            )
        raise UnknownParameter(f"Unknown parameter '{name}'.", param=name)


def _refuse_reasoning(value) -> None:
    """These models do not reason apart from their answer: only the neutral settings pass
    (no effort, or "none", and no summary)."""
    if value is None:
        return
    _require(isinstance(value, dict), "reasoning must be an object or null.", "reasoning")
    extra = sorted(set(value) - REASONING_FIELDS)
    if extra:
        raise UnknownParameter(
            f"reasoning has unknown field(s): {', '.join(extra)}.", param="reasoning"
        )
    for name, setting in value.items():
        if setting is None or (name == "effort" and setting == "none"):
            continue
        raise UnsupportedParameter(
            f"reasoning.{name} is not supported: this server's models do not reason apart "
            'from their answer (send no reasoning, or effort "none").',
            param=f"reasoning.{name}",
        )


def _parse_metadata(value) -> dict[str, str]:
    if value is None:
        return {}
    _require(
        isinstance(value, dict) and len(value) <= MAX_METADATA_PAIRS,
        f"metadata must be an object of at most {MAX_METADATA_PAIRS} string pairs.",
        "metadata",
    )
    for key, item in value.items():
        _require(
            len(key) <= MAX_METADATA_KEY
            and isinstance(item, str)
            and len(item) <= MAX_METADATA_VALUE,
            f"metadata keys are at most {MAX_METADATA_KEY} characters, values strings of at "
            f"most {MAX_METADATA_VALUE}.",
            "metadata",
        )
    return dict(value)


def _optional_bool(body: dict, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    _require(isinstance(value, bool), f"{name} must be a boolean.", name)
    return value


def _optional_text(value, param: str) -> str | None:
    """A string, or None for null or "" (no instructions, say)."""
    if value is None:
        return None
    _require(isinstance(value, str), f"{param} must be a string.", param)
    return value or None


def _optional_count(value, param: str) -> int | None:
    if value is None:
        return None
    _require(
        isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_COUNT,
        f"{param} must be an integer from 1 to {MAX_COUNT}.",
        param,
    )
    return value


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _require(ok, message: str, param: str) -> None:
    if not ok:
        raise ProtocolError(message, param=param)
