"""How one request wants its tokens chosen and when it wants to stop."""

import math
from dataclasses import dataclass, field

from .errors import SamplingParamsError
from .structured_output import StructuredOutput

MAX_LOGPROBS = 20  # top-N alternatives per token, as in the OpenAI API
MAX_PENALTY = 2.0  # presence and frequency penalties: -2 to 2, as in the OpenAI API
MAX_LOGIT_BIAS = 100.0  # a logit_bias value: -100 to 100, as in the OpenAI API


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0  # nucleus: keep the smallest set of tokens whose probability reaches top_p
    top_k: int = -1  # keep the k most likely tokens; -1 keeps all
    seed: int | None = None  # same seed, same prompt -> same tokens, whatever else is batched
    min_p: float = 0.0  # drop tokens less likely than min_p times the most likely one
    # Subtracted from a token's logit: presence once it is in the completion, frequency
    # per time it is there (OpenAI's); repetition divides a positive logit of a token in the
    # prompt or completion and multiplies a negative one (transformers', vLLM's).
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit
    max_tokens: int = 16
    # end-of-sequence and stop tokens held back, stop strings not looked for, until this many
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)  # ends the text
    include_stop_str_in_output: bool = False  # keep the stop string (or stop token's text)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False  # keep going past the model's end-of-sequence tokens
    skip_special_tokens: bool = True  # special tokens add no text
    logprobs: int | None = None  # None: no logprobs; N: the chosen token plus the top N
    # None: none; N: every prompt token's logprob (the first has none) plus the top N there
    prompt_logprobs: int | None = None
    # JSON matching a schema, or any JSON object; the output ends ("stop") once it is whole
    structured_output: StructuredOutput | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids)
        _check(
            isinstance(self.temperature, int | float) and self.temperature >= 0,
            f"temperature must be a number >= 0 (0 is greedy), got {self.temperature!r}",
        )
        _check(
            isinstance(self.top_p, int | float) and 0 < self.top_p <= 1,
            f"top_p must be in (0, 1], got {self.top_p!r}",
        )
        _check(
            _is_int(self.top_k) and (self.top_k == -1 or self.top_k >= 1),
            f"top_k must be -1 (disabled) or a positive integer, got {self.top_k!r}",
        )
        _check(
            _is_int(self.max_tokens) and self.max_tokens >= 1,
            f"max_tokens must be a positive integer, got {self.max_tokens!r}",
        )
        _check(
            self.seed is None or _is_int(self.seed), f"seed must be an integer, got {self.seed!r}"
        )
        self._check_adjustments()
        _check(
            all(isinstance(s, str) and s for s in self.stop),
            "stop must be a list of non-empty strings",
        )
        _check(
            all(_is_int(t) and t >= 0 for t in self.stop_token_ids),
            "stop_token_ids must be non-negative integers",
        )
        _check(
            self.logprobs is None
            or (_is_int(self.logprobs) and 0 <= self.logprobs <= MAX_LOGPROBS),
            f"logprobs must be between 0 and {MAX_LOGPROBS}, got {self.logprobs!r}",
        )
        _check(
            self.prompt_logprobs is None
            or (_is_int(self.prompt_logprobs) and 0 <= self.prompt_logprobs <= MAX_LOGPROBS),
            f"prompt_logprobs must be between 0 and {MAX_LOGPROBS}, got {self.prompt_logprobs!r}",
        )
        _check(
            self.structured_output is None or isinstance(self.structured_output, StructuredOutput),
            f"structured_output must be a StructuredOutput or None, "
            f"got {type(self.structured_output).__name__}",
        )

    def _check_adjustments(self) -> None:
        """The values that reshape the logits before a token is chosen: all finite, so no
        NaN reaches the sampler."""
        self.logit_bias = dict(self.logit_bias)
        _check(
            _is_number(self.min_p) and 0 <= self.min_p <= 1,
            f"min_p must be in [0, 1], got {self.min_p!r}",
        )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(
                _is_number(value) and -MAX_PENALTY <= value <= MAX_PENALTY,
                f"{name} must be in [-{MAX_PENALTY}, {MAX_PENALTY}], got {value!r}",
            )
        _check(
            _is_number(self.repetition_penalty)
            and self.repetition_penalty > 0
            and math.isfinite(self.repetition_penalty),
            f"repetition_penalty must be a finite number > 0, got {self.repetition_penalty!r}",
        )
        _check(
            all(
                _is_int(t) and t >= 0 and _is_number(b) and abs(b) <= MAX_LOGIT_BIAS
                for t, b in self.logit_bias.items()
            ),
            f"logit_bias must map token ids to numbers in [-{MAX_LOGIT_BIAS}, {MAX_LOGIT_BIAS}]",
        )
        _check(
            _is_int(self.min_tokens) and 0 <= self.min_tokens <= self.max_tokens,
            f"min_tokens must be an integer from 0 to max_tokens ({self.max_tokens}), "
            f"got {self.min_tokens!r}",
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    @property
    def adjusts_logits(self) -> bool:
        """Whether its logits change before the draw beyond temperature, top-k and top-p."""
        return bool(
            self.min_p
            or self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1
            or self.logit_bias
            or self.min_tokens
        )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise SamplingParamsError(message)
