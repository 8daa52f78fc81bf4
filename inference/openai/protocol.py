"""Parsing OpenAI-style request bodies into what the engine needs, refusing what it can't honour.

Pure functions, no Django: every refusal is a `ProtocolError` naming the parameter, so a
client learns at once that (say) `presence_penalty` is not supported instead of getting
an answer that silently ignored it. `response_format` is parsed in
inference/response_format.py, `tools` and `tool_choice` in inference/tools.py.
"""

import json
from dataclasses import dataclass, field

from .constraints import JsonConstraint
from .errors import InvalidJson, ProtocolError, UnknownParameter, UnsupportedParameter
from .fields import refuse_extra_fields
from .response_format import parse_response_format
from .tools import ToolUse, parse_tool_use

MAX_TOP_LOGPROBS = 20
MAX_STOP_SEQUENCES = 4
# `n`: one HTTP request fans out into at most this many engine requests, one per choice, on
# the same prompt tokens (each choice's tokens cost like a request's).
MAX_CHOICES = 16
# Every number has bounds, so none reaches torch (or a C long) out of range: a seed seeds a
# torch.Generator, which takes 64 bits; the engine draws its own seeds from 63 of them.
MAX_SEED = 2**63 - 1
MAX_COUNT = 2**31 - 1  # max_tokens, top_k: far beyond any context or vocabulary

# Accepted only at their neutral value: anything else would change the answer in a way
# the engine does not implement.
_NEUTRAL: dict[str, tuple] = {
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "logit_bias": ({},),
    "best_of": (1,),
    "echo": (False,),
    "parallel_tool_calls": (False,),  # the chat API takes tools; completions do not
    "tools": ([],),
    "functions": ([],),  # OpenAI's deprecated form of tools
    "tool_choice": ("none",),
    "function_call": ("none",),
    "suffix": ("",),
    "modalities": (["text"],),
}
# Metadata with no effect on generation.
_IGNORED = {"user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier"}
_COMMON = {
    "model",
    "stream",
    "stream_options",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "ignore_eos",
    "n",
    "prompt_logprobs",  # vLLM's extension: the prompt tokens' logprobs
    "response_format",
}
CHAT_FIELDS = _COMMON | {
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "logprobs",
    "top_logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
}
COMPLETION_FIELDS = _COMMON | {"prompt", "max_tokens", "logprobs"}
TEXT_ROLES = {"system", "developer", "user", "assistant"}
CHAT_ROLES = TEXT_ROLES | {"tool"}
_FIELDS = {"role", "content", "name"}
_ASSISTANT_FIELDS = _FIELDS | {"tool_calls", "refusal"}
_TOOL_FIELDS = {"role", "content", "tool_call_id"}


@dataclass
class GenerationRequest:
    """One parsed request. `messages` for chat, `prompt` (text or token ids) for completions."""

    model: str
    stream: bool = False
    include_usage: bool = False
    messages: list[dict] | None = None
    prompt: str | list[int] | None = None
    max_tokens: int | None = None  # None: up to the end of the context
    max_tokens_param: str = "max_tokens"  # the name the client used, for error messages
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # None: off; N: chosen token plus the top N
    n: int = 1  # choices: one engine request each
    prompt_logprobs: int | None = None  # None: off; N: each prompt token's plus the top N
    constraint: JsonConstraint | None = None  # the output must be JSON (response_format, tools)
    tool_use: ToolUse | None = None  # chat: tools shown to the model, calls read from its answer

    def sampling_kwargs(self, choice: int = 0) -> dict:
        """SamplingParams' arguments for choice `choice` (0 to n - 1). As in vLLM, choice i
        samples with `seed + i` (without a seed the engine draws one per request); only choice
        0 asks for the prompt's logprobs, which are the same for every choice."""
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": None if self.seed is None else self.seed + choice,
            "stop": self.stop,
            "ignore_eos": self.ignore_eos,
            "logprobs": self.logprobs,
            "prompt_logprobs": self.prompt_logprobs if choice == 0 else None,
        }


def load_json(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except ValueError as exc:  # bad JSON or UTF-8, or an integer of more than 4300 digits
        raise InvalidJson(f"The request body is not valid JSON: {exc}.") from None
    except RecursionError:
        raise InvalidJson("The request body is nested too deeply.") from None
    if not isinstance(body, dict):
        raise InvalidJson("The request body must be a JSON object.")
    return body


def parse_chat_request(body: dict) -> GenerationRequest:
    _refuse_unsupported(body, CHAT_FIELDS)
    request = _parse_common(body)
    request.messages = _parse_messages(body.get("messages"), with_tools=True)
    request.tool_use = parse_tool_use(body)
    forced = request.tool_use.forced_constraint() if request.tool_use else None
    if request.tool_use is not None and request.constraint is not None:
        raise ProtocolError(
            'response_format cannot be combined with tools unless tool_choice is "none": '
            "an answer held to a format leaves the model no way to call a tool.",
            param="response_format",
        )
    request.constraint = forced or request.constraint
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    param = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    request.max_tokens = _optional_positive_int(max_tokens, param)
    request.max_tokens_param = param
    logprobs = body.get("logprobs")
    if logprobs not in (None, True, False):
        raise ProtocolError("logprobs must be a boolean.", param="logprobs")
    top = body.get("top_logprobs")
    if top is not None and not logprobs:
        raise ProtocolError("top_logprobs needs logprobs: true.", param="top_logprobs")
    _optional_int(top, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    request.logprobs = (top or 0) if logprobs else None
    return request


def parse_completion_request(body: dict) -> GenerationRequest:
    _refuse_unsupported(body, COMPLETION_FIELDS)
    request = _parse_common(body)
    request.prompt = _parse_prompt(body.get("prompt"))
    request.max_tokens = _optional_positive_int(body.get("max_tokens", 16), "max_tokens")
    request.logprobs = _optional_int(body.get("logprobs"), "logprobs", 0, MAX_TOP_LOGPROBS)
    return request


def parse_chat_messages(messages) -> list[dict]:
    """`messages` checked as a chat request's, without tool calls and tool results (the
    registry's eval sets use it): a list of `{"role", "content"}` dicts with roles
    normalised, or a ProtocolError naming the offending `messages[i]` field."""
    return _parse_messages(messages, with_tools=False)


def _refuse_unsupported(body: dict, allowed: set[str]):
    for name, value in body.items():
        if name in allowed or name in _IGNORED:
            continue
        if name in _NEUTRAL:
            if value is None or value in _NEUTRAL[name]:
                continue
            raise UnsupportedParameter(
                f"The parameter '{name}' is not supported by this server.", param=name
            )
        raise UnknownParameter(f"Unknown parameter '{name}'.", param=name)


def _parse_common(body: dict) -> GenerationRequest:
    model = body.get("model")
    if not (isinstance(model, str) and model.strip()):  # inline: tells mypy model is a str
        raise ProtocolError("model is required (a model name string).", param="model")
    stream = body.get("stream", False) or False
    _require(isinstance(stream, bool), "stream must be a boolean.", "stream")
    options = body.get("stream_options") or {}
    _require(
        isinstance(options, dict) and set(options) <= {"include_usage"},
        "stream_options may only hold include_usage.",
        "stream_options",
    )
    if options and not stream:
        raise ProtocolError("stream_options needs stream: true.", param="stream_options")
    request = GenerationRequest(
        model=model.strip(), stream=stream, include_usage=bool(options.get("include_usage", False))
    )
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
    top_k = body.get("top_k")
    if top_k is not None:
        _require(
            _is_int(top_k) and (top_k == -1 or 1 <= top_k <= MAX_COUNT),
            f"top_k must be -1 (off) or an integer from 1 to {MAX_COUNT}.",
            "top_k",
        )
        request.top_k = top_k
    seed = body.get("seed")
    if seed is not None:
        _require(
            _is_int(seed) and 0 <= seed <= MAX_SEED,
            f"seed must be an integer from 0 to {MAX_SEED} (2**63 - 1).",
            "seed",
        )
        request.seed = seed
    request.stop = _parse_stop(body.get("stop"))
    ignore_eos = body.get("ignore_eos", False)
    _require(isinstance(ignore_eos, bool), "ignore_eos must be a boolean.", "ignore_eos")
    request.ignore_eos = ignore_eos
    request.n = _parse_n(body.get("n"), request.seed)
    request.prompt_logprobs = _parse_prompt_logprobs(body.get("prompt_logprobs"), stream)
    request.constraint = parse_response_format(body.get("response_format"))
    return request


def _parse_n(value, seed: int | None) -> int:
    n = _optional_int(value, "n", 1, MAX_CHOICES)
    if n is None:
        return 1
    if seed is not None and seed > MAX_SEED - (n - 1):
        raise ProtocolError(
            f"With n={n}, seed must be at most {MAX_SEED - (n - 1)} (2**63 - {n}): choice i "
            "samples with seed + i, which must stay within 2**63 - 1.",
            param="seed",
        )
    return n


def _parse_prompt_logprobs(value, stream: bool) -> int | None:
    k = _optional_int(value, "prompt_logprobs", 0, MAX_TOP_LOGPROBS)
    # vLLM refuses them in a stream too: a stream has no place for them.
    _require(
        k is None or not stream,
        "prompt_logprobs are not available with stream: true.",
        "prompt_logprobs",
    )
    return k


def _parse_stop(stop) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    _require(
        isinstance(stops, list) and all(isinstance(s, str) and s for s in stops),
        "stop must be a non-empty string or a list of them.",
        "stop",
    )
    _require(
        len(stops) <= MAX_STOP_SEQUENCES,
        f"stop takes at most {MAX_STOP_SEQUENCES} sequences.",
        "stop",
    )
    return stops


def _parse_messages(messages, *, with_tools: bool = False) -> list[dict]:
    """`with_tools`: assistant messages may carry `tool_calls`, and `tool` messages answer
    them (each right after the calls it answers, as OpenAI requires)."""
    _require(
        isinstance(messages, list) and messages, "messages must be a non-empty list.", "messages"
    )
    roles = CHAT_ROLES if with_tools else TEXT_ROLES
    parsed = []
    pending: set[str] = set()  # ids of the latest tool calls no tool message answered yet
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        _require(isinstance(message, dict), f"{where} must be an object.", where)
        role = message.get("role")
        _require(
            isinstance(role, str) and role in roles,
            f"{where}.role must be one of {', '.join(sorted(roles))}; got {role!r}.",
            f"{where}.role",
        )
        if role == "tool":
            parsed.append(_parse_tool_result(message, where, pending))
            continue
        pending = set()
        if role == "assistant" and with_tools:
            refuse_extra_fields(message, _ASSISTANT_FIELDS, where)
            entry = _parse_assistant(message, where)
            pending = {call["id"] for call in entry.get("tool_calls", [])}
            parsed.append(entry)
            continue
        refuse_extra_fields(message, _FIELDS, where)
        content = _message_text(message.get("content"), where)
        if role != "assistant":
            _require(content.strip(), f"{where}.content must not be empty.", f"{where}.content")
        parsed.append({"role": "system" if role == "developer" else role, "content": content})
    _require(
        parsed[-1]["role"] != "assistant" or len(parsed) > 1,
        "messages must hold at least one system or user message.",
        "messages",
    )
    return parsed


def _parse_assistant(message: dict, where: str) -> dict:
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


def _parse_tool_calls(calls, where: str) -> list[dict]:
    if calls is None:
        return []
    _require(isinstance(calls, list), f"{where}.tool_calls must be a list.", f"{where}.tool_calls")
    parsed = []
    for j, call in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        _require(
            isinstance(call, dict)
            and set(call) == {"id", "type", "function"}
            and call["type"] == "function"
            and isinstance(call["id"], str)
            and call["id"]
            and isinstance(function, dict)
            and set(function) == {"name", "arguments"}
            and isinstance(function["name"], str)
            and isinstance(function["arguments"], str),
            f'{at} must be {{"id": str, "type": "function", "function": {{"name": str, '
            '"arguments": str}}}.',
            at,
        )
        assert isinstance(function, dict)  # for mypy: checked above
        try:
            arguments = json.loads(function["arguments"])
        except ValueError:
            arguments = None
        _require(
            isinstance(arguments, dict),
            f"{at}.function.arguments must be a JSON object, as a string.",
            f"{at}.function.arguments",
        )
        parsed.append(
            {
                "id": call["id"],
                "type": "function",
                "function": {"name": function["name"], "arguments": arguments},
            }
        )
    return parsed


def _parse_tool_result(message: dict, where: str, pending: set[str]) -> dict:
    """A tool's answer to one of the calls of the assistant message just before."""
    refuse_extra_fields(message, _TOOL_FIELDS, where)
    call_id = message.get("tool_call_id")
    if not (isinstance(call_id, str) and call_id in pending):
        raise ProtocolError(
            f"{where}.tool_call_id must name a tool call of the assistant message before it "
            f"that no tool message answered yet; got {call_id!r}.",
            param=f"{where}.tool_call_id",
        )
    pending.discard(call_id)
    content = _message_text(message.get("content"), where)
    return {"role": "tool", "content": content, "tool_call_id": call_id}


def _message_text(content, where: str) -> str:
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
    raise ProtocolError(
        f"{where}.content must be a string or a list of text parts.", param=f"{where}.content"
    )


def _parse_prompt(prompt) -> str | list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        _require(prompt != "", "prompt must not be empty.", "prompt")
        return prompt
    if isinstance(prompt, list) and prompt and all(_is_int(t) and t >= 0 for t in prompt):
        return prompt
    raise ProtocolError(
        "prompt must be a non-empty string, or a list of token ids "
        "(batches of prompts are not supported).",
        param="prompt",
    )


def _optional_positive_int(value, param: str) -> int | None:
    return _optional_int(value, param, 1, MAX_COUNT)


def _optional_int(value, param: str, low: int, high: int) -> int | None:
    if value is None:
        return None
    _require(
        _is_int(value) and low <= value <= high,
        f"{param} must be an integer from {low} to {high}.",
        param,
    )
    return value


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _require(ok, message: str, param: str | None):
    if not ok:
        raise ProtocolError(message, param=param)
