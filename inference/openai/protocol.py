"""Parsing chat and completion request bodies into what the engine needs, refusing what it
can't honour.

Pure functions, no Django: every refusal is a `ProtocolError` naming the parameter, so a
client learns at once that (say) `suffix` is not supported instead of getting an answer
that silently ignored it. `response_format` is parsed in response_format.py, penalties,
logit_bias and vLLM's sampling extras in sampling_options.py,
`tools` and `tool_choice` in tools.py, `messages` by the engine's chat_messages.py.
"""

import json
from dataclasses import dataclass, field

from inference.engine.chat_messages import parse_messages
from inference.engine.errors import InvalidMessagesError
from inference.errors import InvalidJson, ProtocolError, UnknownParameter, UnsupportedParameter

from .best_of import parse_best_of
from .constraints import JsonConstraint
from .prompts import Prompt, parse_prompts
from .response_format import parse_response_format
from .sampling_options import SAMPLING_FIELDS, SamplingOptions, parse_sampling_options
from .schema_limits import SchemaBudget
from .text_fields import refuse_invalid_text
from .tools import ToolUse, parse_tool_use

MAX_TOP_LOGPROBS = 20
MAX_STOP_SEQUENCES = 4
# `n`: one HTTP request fans out into at most this many engine requests, one per choice, on
# the same prompt tokens (each choice's tokens cost like a request's).
MAX_CHOICES = 16
# A completions batch: prompts times candidates (`best_of`, else `n`) engine requests at most.
MAX_ENGINE_REQUESTS = 256
# Every number has bounds, so none reaches torch (or a C long) out of range: a seed seeds a
# torch.Generator, which takes 64 bits; the engine draws its own seeds from 63 of them.
MAX_SEED = 2**63 - 1
MAX_COUNT = 2**31 - 1  # max_tokens, top_k: far beyond any context or vocabulary

# Accepted only at their neutral value: anything else would change the answer in a way
# the engine does not implement.
_NEUTRAL: dict[str, tuple] = {
    "parallel_tool_calls": (False,),  # the chat API takes tools; completions do not
    "tools": ([],),
    "functions": ([],),  # OpenAI's deprecated form of tools
    "tool_choice": ("none",),
    "function_call": ("none",),
    "suffix": ("",),
    "modalities": (["text"],),
}
# The completions API's alone: chat accepts them only at their neutral value.
_COMPLETIONS_ONLY: dict[str, tuple] = {"echo": (False,), "best_of": (1,)}
# `continuous_usage_stats` is vLLM's (benchmark clients count tokens as they stream with it).
STREAM_OPTIONS = {"include_usage", "continuous_usage_stats"}
# Metadata with no effect on generation.
IGNORED_FIELDS = {
    "user",
    "metadata",
    "store",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
}
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
} | SAMPLING_FIELDS
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
COMPLETION_FIELDS = _COMMON | {"prompt", "max_tokens", "logprobs", "echo", "best_of"}


@dataclass
class GenerationRequest:
    """One parsed request. `messages` for chat, `prompts` (each a text or token ids) for
    completions."""

    model: str
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False  # vLLM's: the usage so far in every chunk of the stream
    messages: list[dict] | None = None
    prompts: list[Prompt] | None = None  # a batch of one or more
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
    sampling: SamplingOptions = field(default_factory=SamplingOptions)  # penalties, bias, ...
    echo: bool = False  # completions: each choice begins with its prompt (echo.py)
    best_of: int | None = None  # completions: candidates per prompt, the n best returned

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
            **self.sampling.sampling_kwargs(),
        }


def load_json(raw: bytes) -> dict:
    """The body of every JSON endpoint of the serving layer: an object whose strings are all
    valid Unicode (text_fields.py)."""
    try:
        body = json.loads(raw)
    except ValueError as exc:  # bad JSON or UTF-8, or an integer of more than 4300 digits
        raise InvalidJson(f"The request body is not valid JSON: {exc}.") from None
    except RecursionError:
        raise InvalidJson("The request body is nested too deeply.") from None
    if not isinstance(body, dict):
        raise InvalidJson("The request body must be a JSON object.")
    refuse_invalid_text(body)  # before any parser, template or tokenizer reads a string
    return body


def parse_chat_request(body: dict) -> GenerationRequest:
    _refuse_unsupported(body, CHAT_FIELDS, _NEUTRAL | _COMPLETIONS_ONLY)
    budget = SchemaBudget()  # one for every schema the request holds
    request = _parse_common(body, budget)
    request.messages = parse_chat_messages(body.get("messages"), with_tools=True)
    request.tool_use = parse_tool_use(body, budget)
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
    request = _parse_common(body, SchemaBudget())
    request.prompts = parse_prompts(body.get("prompt"))
    echo = body.get("echo")
    _require(echo is None or isinstance(echo, bool), "echo must be a boolean.", "echo")
    request.echo = bool(echo)
    request.max_tokens = _completion_max_tokens(body.get("max_tokens", 16), request.echo)
    request.logprobs = _optional_int(body.get("logprobs"), "logprobs", 0, MAX_TOP_LOGPROBS)
    request.best_of = parse_best_of(
        body.get("best_of"),
        n=request.n,
        stream=request.stream,
        seed=request.seed,
        limit=MAX_CHOICES,
        max_seed=MAX_SEED,
    )
    fan_out = len(request.prompts) * (request.best_of or request.n)
    _require(
        fan_out <= MAX_ENGINE_REQUESTS,
        f"{len(request.prompts)} prompts of {request.best_of or request.n} choices each are "
        f"{fan_out} generations; at most {MAX_ENGINE_REQUESTS} per request (fewer prompts, "
        "a lower n or best_of).",
        "prompt",
    )
    return request


def _completion_max_tokens(value, echo: bool) -> int | None:
    """0 only with echo: the prompt's logprobs alone, no token generated (a harness scoring
    a text)."""
    if _is_int(value) and value == 0:
        _require(echo, "max_tokens may be 0 only with echo: true (the prompt alone).", "max_tokens")
        return 0
    return _optional_positive_int(value, "max_tokens")


def parse_chat_messages(messages, *, with_tools: bool = False) -> list[dict]:
    """`messages` as the chat template takes them; `with_tools`: with tool calls and tool
    results. A ProtocolError names the offending `messages[i]` field."""
    try:
        return parse_messages(messages, with_tools=with_tools)
    except InvalidMessagesError as exc:
        raise ProtocolError(str(exc), param=exc.param) from None


def _refuse_unsupported(body: dict, allowed: set[str], neutral: dict[str, tuple] = _NEUTRAL):
    for name, value in body.items():
        if name in allowed or name in IGNORED_FIELDS:
            continue
        if name in neutral:
            if value is None or value in neutral[name]:
                continue
            raise UnsupportedParameter(
                f"The parameter '{name}' is not supported by this server.", param=name
            )
        raise UnknownParameter(f"Unknown parameter '{name}'.", param=name)


def _parse_common(body: dict, budget: SchemaBudget) -> GenerationRequest:
    model = body.get("model")
    if not (isinstance(model, str) and model.strip()):  # inline: tells mypy model is a str
        raise ProtocolError("model is required (a model name string).", param="model")
    stream = body.get("stream", False) or False
    _require(isinstance(stream, bool), "stream must be a boolean.", "stream")
    options = body.get("stream_options") or {}
    _require(
        isinstance(options, dict) and set(options) <= STREAM_OPTIONS,
        "stream_options may only hold include_usage and continuous_usage_stats.",
        "stream_options",
    )
    if options and not stream:
        raise ProtocolError("stream_options needs stream: true.", param="stream_options")
    continuous = options.get("continuous_usage_stats")
    _require(
        continuous is None or isinstance(continuous, bool),
        "stream_options.continuous_usage_stats must be a boolean.",
        "stream_options.continuous_usage_stats",
    )
    request = GenerationRequest(
        model=model.strip(),
        stream=stream,
        include_usage=bool(options.get("include_usage", False)),
        continuous_usage=bool(continuous),
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
    request.constraint = parse_response_format(body.get("response_format"), budget)
    request.sampling = parse_sampling_options(body)
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
