"""How one step's prefill tokens are divided between tenants (fairness keys).

Tenants share the tokens a step has left for prefills equally (max-min fair: a tenant that
needs less than an equal share takes what it needs, and the others split the rest), and a
tenant's own prompts take its share in turn, oldest first. Step time on cpu grows with the
tokens fed, and a request's first token waits for its whole step: so beside another tenant's
shorter prompt, a prompt feeds no more than that one needs (at least `long_threshold`
tokens, so it keeps advancing), and the short request's step costs about what it would
alone. Prompts of one tenant in a row are never capped against each other.

Pure arithmetic on (tenant, tokens needed) claims; the scheduler decides which sequences
make claims and feeds each the tokens its claim is given.
"""

from collections.abc import Hashable
from dataclasses import dataclass


@dataclass
class Claim:
    """One prompt's part of a step: `need` tokens left to feed, `want` of them this step
    (its need capped beside other tenants' shorter prompts), `tokens` given."""

    key: Hashable  # its tenant; None is a tenant like any other
    need: int
    want: int = 0
    tokens: int = 0

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

    def __init__(self, budget: int, long_threshold: int, max_partial: int):
        self.budget = budget
        self.long_threshold = long_threshold  # 0: prompts are never capped
        self.max_partial = max_partial
        self.claims: list[Claim] = []

    @property
    def num_tenants(self) -> int:
        return len({c.key for c in self.claims})

    @property
    def num_partial(self) -> int:
        return sum(c.partial for c in self.claims)

    def add(self, key: Hashable, need: int) -> Claim:
        """A prompt already part-way (a running prefill): it always takes part."""
        claim = Claim(key, need)
        self.claims.append(claim)
        self._divide()
        return claim

    def offer(self, key: Hashable, need: int) -> Claim | None:
        """A waiting prompt: it joins if it gets any token and the prompts left part-way
        (itself, or others whose tokens it takes) stay at most `max_partial`, or as many
        as the prompts already under way. None: it waits (the others are as they were)."""
        partial_before = self.num_partial
        claim = self.add(key, need)
        if claim.tokens and self.num_partial <= max(self.max_partial, partial_before):
            return claim
        self.claims.pop()
        self._divide()
        return None

    def _divide(self) -> None:
        for claim, want in zip(self.claims, self._capped_needs(), strict=True):
            claim.want = want
        tenants = list(dict.fromkeys(c.key for c in self.claims))
        demand = {k: 0 for k in tenants}
        for claim in self.claims:
            demand[claim.key] += claim.want
        share = dict(zip(tenants, water_fill(self.budget, list(demand.values())), strict=True))
        for claim in self.claims:  # oldest first in a tenant
            claim.tokens = min(claim.want, share[claim.key])
            share[claim.key] -= claim.tokens

    def _capped_needs(self) -> list[int]:
        """Each claim's need, capped at the need of the shortest prompt another tenant
        starts with in this step (at least `long_threshold`)."""
        if not self.long_threshold:
            return [c.need for c in self.claims]
        heads: dict[Hashable, int] = {}
        for claim in self.claims:
            heads.setdefault(claim.key, claim.need)
        wants = []
        for claim in self.claims:
            others = [need for key, need in heads.items() if key != claim.key]
            cap = max(self.long_threshold, min(others)) if others else claim.need
            wants.append(min(claim.need, cap))
        return wants
