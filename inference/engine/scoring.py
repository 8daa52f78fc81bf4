"""Scoring: the log-likelihood of a given completion after a given prompt, without
generating. One request whose prompt is the two together, asking for prompt logprobs and a
single token; the completion's entries are the answer. It skips the prefix cache (prompt
logprobs need every position's logits) and runs at background priority by default, so the
platform's own evaluations never hold up tenants' traffic."""

from dataclasses import dataclass

from .errors import InvalidRequestError
from .logprobs import TokenLogprob
from .request import EngineRequest, LoRARequest, Priority
from .sampling_params import SamplingParams


@dataclass
class ScoreResult:
    token_logprobs: list[float]  # one per completion token
    logprob: float  # their sum: log P(completion | prompt)

    @property
    def num_tokens(self) -> int:
        return len(self.token_logprobs)


def score_request(
    request_id: str,
    prompt_token_ids: list[int],
    completion_token_ids: list[int],
    lora_request: LoRARequest | None = None,
    priority: int = Priority.BACKGROUND,
) -> EngineRequest:
    if not prompt_token_ids or not completion_token_ids:
        raise InvalidRequestError("scoring needs a non-empty prompt and a non-empty completion")
    return EngineRequest(
        request_id,
        sampling_params=SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0),
        prompt_token_ids=list(prompt_token_ids) + list(completion_token_ids),
        lora_request=lora_request,
        priority=priority,
    )


def score_result(
    prompt_logprobs: list[TokenLogprob | None] | None, num_prompt_tokens: int
) -> ScoreResult:
    """The completion's part of a scoring request's prompt logprobs."""
    if prompt_logprobs is None:
        raise InvalidRequestError("the scoring request ended without its prompt logprobs")
    values = [entry.logprob for entry in prompt_logprobs[num_prompt_tokens:] if entry is not None]
    return ScoreResult(values, sum(values))
