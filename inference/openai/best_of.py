"""`best_of` (the completions API): generate `best_of` candidates for each prompt and return
the `n` whose tokens the model found most likely together (the highest cumulative logprob),
as vLLM does. Every candidate's tokens are generated, so usage counts them all.

The best `n` are known only once every candidate has finished, so a stream cannot carry
them: `best_of` above `n` is refused with `stream`, as OpenAI and vLLM refuse it.
"""

from collections.abc import Callable, Sequence
from typing import TypeVar

from inference.errors import ProtocolError

T = TypeVar("T")


def parse_best_of(value, *, n: int, stream: bool, seed: int | None, limit: int, max_seed: int):
    """The number of candidates per prompt (None: `n`). `limit` bounds it like `n`; candidate
    i samples with `seed + i`, so `seed` must leave room for the last one."""
    if value is None:
        return None
    if not (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= limit):
        raise ProtocolError(f"best_of must be an integer from 1 to {limit}.", param="best_of")
    if value < n:
        raise ProtocolError(
            f"best_of ({value}) must be at least n ({n}): the n choices are the best of "
            "best_of candidates.",
            param="best_of",
        )
    if stream and value > n:
        raise ProtocolError(
            "best_of greater than n is not available with stream: true (the best n are known "
            "only once every candidate has finished).",
            param="best_of",
        )
    if seed is not None and seed > max_seed - (value - 1):
        raise ProtocolError(
            f"With best_of={value}, seed must be at most {max_seed - (value - 1)}: candidate i "
            "samples with seed + i, which must stay within 2**63 - 1.",
            param="seed",
        )
    return value


def best_n(candidates: Sequence[T], n: int, cumulative_logprob: Callable[[T], float]) -> list[T]:
    """The `n` most likely candidates, most likely first; ties keep the candidates' order."""
    if len(candidates) <= n:
        return list(candidates)
    return sorted(candidates, key=cumulative_logprob, reverse=True)[:n]
