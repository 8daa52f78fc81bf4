"""One HTTP request as engine requests: each prompt of the batch times its candidates (`n`
choices, or `best_of` to pick them from), one engine request each, numbered prompt-major
(prompt p, candidate c -> p * candidates + c), the order OpenAI numbers choices in.

What echo and best_of need from the engine is asked for here, on top of the request's own
sampling: the prompt's logprobs for every echoing choice, and each token's logprob where
best_of ranks candidates by them.
"""

from .protocol import GenerationRequest


def candidates(parsed: GenerationRequest) -> int:
    """Engine requests per prompt."""
    return parsed.best_of or parsed.n


def candidate_kwargs(parsed: GenerationRequest, candidate: int, max_tokens: int) -> dict:
    """SamplingParams' arguments for candidate `candidate` of a prompt that may generate
    `max_tokens` tokens."""
    kwargs = {**parsed.sampling_kwargs(candidate), "max_tokens": max(max_tokens, 1)}
    # (max_tokens 0, with echo: the engine samples one token all the same, which is dropped)
    if parsed.echo and parsed.logprobs is not None:
        # each choice, streamed too, begins with the prompt's logprobs
        kwargs["prompt_logprobs"] = max(parsed.logprobs, parsed.prompt_logprobs or 0)
    if candidates(parsed) > parsed.n and kwargs["logprobs"] is None:
        kwargs["logprobs"] = 0  # the chosen tokens' own logprobs rank the candidates
    return kwargs


def engine_tokens(parsed: GenerationRequest, prompt_tokens: int, completion_tokens: int) -> int:
    """What a request costs the engine, and so the tenant's token budget: every engine request
    reads its prompt, so each prompt counts once per candidate (`usage` counts it once, as
    OpenAI's does), and `completion_tokens` are every candidate's together."""
    return prompt_tokens * candidates(parsed) + completion_tokens
