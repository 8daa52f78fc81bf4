"""How one request wants its tokens chosen and when it wants to stop."""

from dataclasses import dataclass, field

from .errors import SamplingParamsError
from .structured_output import StructuredOutput

MAX_LOGPROBS = 20  # top-N alternatives per token, as in the OpenAI API


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0  # nucleus: keep the smallest set of tokens whose probability reaches top_p
    top_k: int = -1  # keep the k most likely tokens; -1 keeps all
    seed: int | None = None  # same seed, same prompt -> same tokens, whatever else is batched
    max_tokens: int = 16
    stop: list[str] = field(default_factory=list)  # ends the text; the stop string is not returned
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False  # keep going past the model's end-of-sequence tokens
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

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise SamplingParamsError(message)
