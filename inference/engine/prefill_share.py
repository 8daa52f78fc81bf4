"""How one step's prefill tokens are divided between tenants (fairness keys).

Tenants share the tokens a step has left for prefills equally (max-min fair: a tenant that
needs less than an equal share takes what it needs, and the others split the rest), and a
tenant's own prompts take its share in turn, oldest first. Step time on cpu grows with the
tokens fed, and a request's first token waits for its whole step: so beside another tenant's
short prompt (shorter, and within an equal share of the step: it can finish in this step), a
prompt feeds no more than `long_threshold` (so it keeps advancing), and the short request's
step costs little more than it would alone. Long prompts of several tenants split the
step equally; prompts of one tenant in a row are never capped against each other.

All of it is counted in cost (prefill_cost.py): on cpu a token deep in a long prompt costs
more of the step than one at the start, so the shares, the caps and the floor are the
step's time, and a prompt's chunk shrinks as it goes.

Pure arithmetic on (tenant, position, tokens needed) claims; the scheduler decides which
sequences make claims and feeds each the tokens its claim is given.
"""

from collections.abc import Hashable
from dataclasses import dataclass

from .prefill_cost import PrefillCost


@dataclass
class Claim:
    """One prompt's part of a step: `need` tokens left to feed from position `start`, `want`
    of them this step (its need capped beside other tenants' shorter prompts), `tokens`
    given, costing `cost` of the step's budget."""

    key: Hashable  # its tenant; None is a tenant like any other
    need: int
    start: int = 0
    want: int = 0
    tokens: int = 0
    cost: int = 0

    @property
    def partial(self) -> bool:
        """Left part-way through its prompt after this step."""
        return self.tokens < self.need


def water_fill(budget: int, demands: list[int]) -> list[int]:
    """Split `budget` max-min fairly: the smallest demands are met whole, the rest share
    what remains equally (the largest demand takes the rounding)."""
    shares = [0] * len(demands)
    left = budget
    order = sorted(range(len(demands)), key=lambda i: demands[i])
    for rank, i in enumerate(order):
        shares[i] = min(demands[i], left // (len(order) - rank))
        left -= shares[i]
    return shares


class PrefillShare:
    """The claims on one step's prefill budget, divided anew whenever one joins."""

    def __init__(
        self,
        budget: int,
        long_threshold: int,
        max_partial: int,
        cost: PrefillCost | None = None,
    ):
        self.budget = budget
        self.long_threshold = long_threshold  # 0: prompts are never capped
        self.max_partial = max_partial
        self.cost = cost or PrefillCost()  # none: every token counts 1
        self.claims: list[Claim] = []

    @property
    def num_tenants(self) -> int:
        return len({c.key for c in self.claims})

    @property
    def num_partial(self) -> int:
        return sum(c.partial for c in self.claims)

    def add(self, key: Hashable, need: int, start: int = 0) -> Claim:
        """A prompt already part-way (a running prefill): it always takes part."""
        claim = Claim(key, need, start)
        self.claims.append(claim)
        self._divide()
        return claim

    def offer(self, key: Hashable, need: int, start: int = 0) -> Claim | None:
        """A waiting prompt: it joins if it gets any token and the prompts left part-way
        (itself, or others whose tokens it takes) stay at most `max_partial`, or as many
        as the prompts already under way. None: it waits (the others are as they were)."""
        partial_before = self.num_partial
        claim = self.add(key, need, start)
        if claim.tokens and self.num_partial <= max(self.max_partial, partial_before):
            return claim
        self.claims.pop()
        self._divide()
        return None

    def _divide(self) -> None:
        wants = self._capped_costs()
        for claim, want in zip(self.claims, wants, strict=True):
            claim.want = self._tokens_within(claim, want)
        tenants = list(dict.fromkeys(c.key for c in self.claims))
        demand = {k: 0 for k in tenants}
        for claim in self.claims:
            demand[claim.key] += self._cost(claim, claim.want)
        share = dict(zip(tenants, water_fill(self.budget, list(demand.values())), strict=True))
        for claim in self.claims:  # oldest first in a tenant; once one is cut, the rest wait
            claim.tokens = min(claim.want, self._tokens_within(claim, share[claim.key]))
            claim.cost = self._cost(claim, claim.tokens)
            share[claim.key] = share[claim.key] - claim.cost if claim.tokens == claim.want else 0

    def _cost(self, claim: Claim, tokens: int) -> int:
        return self.cost.of(claim.start, tokens)

    def _tokens_within(self, claim: Claim, cost: int) -> int:
        """The claim's tokens that `cost` pays for; one at least when it is any, so a prompt
        deeper than one token's worth of the floor or of a share still advances."""
        return min(claim.need, max(self.cost.tokens_within(claim.start, cost), cost > 0))

    def _capped_costs(self) -> list[int]:
        """Each claim's need as a cost, capped at `long_threshold` when another tenant's
        prompt is shorter and fits its equal share of the step."""
        needs = [self._cost(c, c.need) for c in self.claims]
        if not self.long_threshold:
            return needs
        heads: dict[Hashable, int] = {}
        for claim, need in zip(self.claims, needs, strict=True):
            heads.setdefault(claim.key, need)
        wants = []
        for claim, need in zip(self.claims, needs, strict=True):
            short = [cost for key, cost in heads.items() if key != claim.key and cost < need]
            capped = bool(short) and min(short) <= self.budget // len(heads)
            wants.append(min(need, self.long_threshold) if capped else need)
        return wants
