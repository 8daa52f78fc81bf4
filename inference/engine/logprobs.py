"""A token's log-probability as callers get it. Its own module because sequences hold these
and outputs, the sampler and scoring make them: it depends on none of them."""

from dataclasses import dataclass


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # (token id, logprob) of the most likely tokens, best first
    rank: int | None = None  # 1 + how many tokens are more likely (prompt logprobs only)
