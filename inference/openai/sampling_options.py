"""The sampling parameters beyond temperature and top-p that clients send: OpenAI's
presence and frequency penalties and logit_bias, and vLLM's extras (through the openai
client's `extra_body`): repetition_penalty, min_p, min_tokens, stop_token_ids,
skip_special_tokens, include_stop_str_in_output.

Parsed with the body, each bad value a ProtocolError naming its parameter. Two checks wait
for what the body alone cannot say: token ids against the model's vocabulary, and min_tokens
against the max_tokens the request ends up with (its own or the deployment's default).
"""

import math
from dataclasses import dataclass, field, fields
from typing import Any

from inference.errors import ProtocolError

MAX_PENALTY = 2.0  # presence_penalty, frequency_penalty: -2 to 2, as OpenAI's
MAX_BIAS = 100.0  # a logit_bias value: -100 to 100, as OpenAI's
MAX_LOGIT_BIAS_ENTRIES = 300  # as OpenAI's
MAX_STOP_TOKEN_IDS = 256
MAX_REPETITION_PENALTY = 100.0  # far past any useful value; keeps logits finite
_MAX_TOKEN_ID_DIGITS = 10  # a token id fits an int32; longer keys are not token ids

SAMPLING_FIELDS = frozenset(
    {
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "repetition_penalty",
        "min_p",
        "min_tokens",
        "stop_token_ids",
        "skip_special_tokens",
        "include_stop_str_in_output",
    }
)


@dataclass(frozen=True)
class SamplingOptions:
    """The parsed values, at their neutral defaults when the body leaves them out."""

    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    min_tokens: int = 0
    logit_bias: dict[int, float] = field(default_factory=dict)
    stop_token_ids: list[int] = field(default_factory=list)
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False

    def sampling_kwargs(self) -> dict[str, Any]:
        """SamplingParams' arguments (copies: each choice's params own theirs)."""
        kwargs = {f.name: getattr(self, f.name) for f in fields(self)}
        return kwargs | {
            "logit_bias": dict(self.logit_bias),
            "stop_token_ids": list(self.stop_token_ids),
        }


def parse_sampling_options(body: dict) -> SamplingOptions:
    """The body's sampling options; null means the default, as OpenAI's API reads it."""
    values: dict[str, Any] = {}
    for name in ("presence_penalty", "frequency_penalty"):
        value = body.get(name)
        if value is not None:
            _require(
                _is_number(value) and -MAX_PENALTY <= value <= MAX_PENALTY,
                f"{name} must be a number from -2 to 2.",
                name,
            )
            values[name] = float(value)
    penalty = body.get("repetition_penalty")
    if penalty is not None:
        _require(
            _is_number(penalty) and 0 < penalty <= MAX_REPETITION_PENALTY,
            f"repetition_penalty must be a number above 0 (1 is none), at most "
            f"{MAX_REPETITION_PENALTY:g}.",
            "repetition_penalty",
        )
        values["repetition_penalty"] = float(penalty)
    min_p = body.get("min_p")
    if min_p is not None:
        _require(_is_number(min_p) and 0 <= min_p <= 1, "min_p must be in [0, 1].", "min_p")
        values["min_p"] = float(min_p)
    min_tokens = body.get("min_tokens")
    if min_tokens is not None:
        _require(
            _is_int(min_tokens) and 0 <= min_tokens <= 2**31 - 1,
            "min_tokens must be an integer from 0 to max_tokens.",
            "min_tokens",
        )
        values["min_tokens"] = min_tokens
    if body.get("logit_bias") is not None:
        values["logit_bias"] = _parse_logit_bias(body["logit_bias"])
    if body.get("stop_token_ids") is not None:
        values["stop_token_ids"] = _parse_stop_token_ids(body["stop_token_ids"])
    for name in ("skip_special_tokens", "include_stop_str_in_output"):
        value = body.get(name)
        if value is not None:
            _require(isinstance(value, bool), f"{name} must be a boolean.", name)
            values[name] = value
    return SamplingOptions(**values)


def check_min_tokens(options: SamplingOptions, max_tokens: int, max_tokens_param: str) -> None:
    """min_tokens no more than the tokens the request may generate."""
    _require(
        options.min_tokens <= max_tokens,
        f"min_tokens is {options.min_tokens} but {max_tokens_param} is {max_tokens}; "
        f"min_tokens must not be above it.",
        "min_tokens",
    )


def check_token_ids(options: SamplingOptions, vocab_size: int) -> None:
    """Every token id the options name is one of the model's (0 to vocab_size - 1)."""
    for name, ids in (
        ("logit_bias", options.logit_bias),
        ("stop_token_ids", options.stop_token_ids),
    ):
        outside = [t for t in ids if t >= vocab_size]
        _require(
            not outside,
            f"{name} names token id {outside[0] if outside else 0}, which is not in this "
            f"model's vocabulary (0 to {vocab_size - 1}).",
            name,
        )


def _parse_logit_bias(value: object) -> dict[int, float]:
    _require(
        isinstance(value, dict),
        'logit_bias must be an object mapping token ids to biases, e.g. {"50256": -100}.',
        "logit_bias",
    )
    assert isinstance(value, dict)
    _require(
        len(value) <= MAX_LOGIT_BIAS_ENTRIES,
        f"logit_bias holds {len(value)} entries; at most {MAX_LOGIT_BIAS_ENTRIES}.",
        "logit_bias",
    )
    biases: dict[int, float] = {}
    for key, bias in value.items():
        _require(
            isinstance(key, str)
            and key.isascii()
            and key.isdigit()
            and len(key) <= _MAX_TOKEN_ID_DIGITS,
            f"logit_bias key {key!r} is not a token id (a non-negative integer, as a string).",
            "logit_bias",
        )
        _require(
            _is_number(bias) and -MAX_BIAS <= bias <= MAX_BIAS,
            f"logit_bias[{key!r}] must be a number from -100 to 100.",
            "logit_bias",
        )
        biases[int(key)] = float(bias)
    return biases


def _parse_stop_token_ids(value: object) -> list[int]:
    _require(
        isinstance(value, list) and all(_is_int(t) and t >= 0 for t in value),
        "stop_token_ids must be a list of token ids (non-negative integers).",
        "stop_token_ids",
    )
    assert isinstance(value, list)
    _require(
        len(value) <= MAX_STOP_TOKEN_IDS,
        f"stop_token_ids holds {len(value)} ids; at most {MAX_STOP_TOKEN_IDS}.",
        "stop_token_ids",
    )
    return list(value)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    """A finite JSON number (Python's json reads NaN and Infinity; they are not numbers here)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _require(ok: bool, message: str, param: str) -> None:
    if not ok:
        raise ProtocolError(message, param=param)
