"""What a prefill chunk costs a step, counted in tokens.

A chunk of n tokens from position `start` on costs its n tokens' linear layers plus their
attention over everything before them, which grows with the position. On cpu that
attention is matrix work like the rest, and deep in a long prompt it costs more than the
linear layers do: a step of 512 tokens at position 7,000 takes about three times as long
as one at the start. A request that arrives waits for the step under way, so the step's
budget counts each prefill token as 1 + (its position / `context`), `context` being the
position at which a token's attention costs as much as its linear layers
(ModelConfig.attention_cost_context), and a long prompt's chunks get shorter as it goes
while every step takes about as long. None: a token counts 1 wherever it is (cuda, whose
attention kernels read the cache in place and cost little beside the weights).
"""

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class PrefillCost:
    context: int | None = None

    def of(self, start: int, tokens: int) -> int:
        """The cost of feeding positions start .. start + tokens - 1."""
        if not self.context or tokens <= 0:
            return max(tokens, 0)
        positions = tokens * start + tokens * (tokens - 1) // 2
        return tokens + -(-positions // self.context)

    def tokens_within(self, start: int, cost: int) -> int:
        """The most tokens from `start` on whose cost is at most `cost`."""
        if not self.context or cost <= 0:
            return max(cost, 0)
        # n + (n * start + n (n - 1) / 2) / context <= cost, a quadratic in n; the root is
        # then corrected for the rounding
        b = self.context + start - 0.5
        n = int(-b + math.sqrt(b * b + 2 * self.context * cost))
        n = max(0, min(n, cost))
        while n < cost and self.of(start, n + 1) <= cost:
            n += 1
        while n and self.of(start, n) > cost:
            n -= 1
        return n
