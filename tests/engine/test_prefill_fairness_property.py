"""Properties of the tenants' shares of a step's prefill tokens, over random claims and
random arrivals: the budget is never exceeded, and every tenant's oldest prompt under way
advances in every step until all are done."""

from hypothesis import given, settings
from hypothesis import strategies as st

from inference.engine import EngineRequest, LLMEngine, SamplingParams
from inference.engine.prefill_cost import PrefillCost
from inference.engine.prefill_share import PrefillShare, water_fill
from inference.engine.sequence import SequenceStatus

claims = st.lists(
    st.tuples(st.integers(0, 3), st.integers(1, 400), st.integers(0, 20_000), st.booleans()),
    max_size=12,
)
pricings = st.sampled_from([PrefillCost(), PrefillCost(3072), PrefillCost(64)])


@given(st.integers(0, 600), st.lists(st.integers(0, 500), max_size=8))
def test_water_fill_is_max_min_fair(budget, demands):
    shares = water_fill(budget, demands)
    assert sum(shares) == min(budget, sum(demands))
    assert all(0 <= s <= d for s, d in zip(shares, demands, strict=True))
    for s, d in zip(shares, demands, strict=True):
        if s < d:  # a demand not met gets at least as much as any other
            assert all(s >= other - 1 for other in shares)


@given(st.integers(1, 600), st.integers(0, 64), st.integers(1, 4), pricings, claims)
def test_the_shares_hold_to_the_budget_and_the_tenants_turns(
    budget, floor, max_partial, pricing, work
):
    share = PrefillShare(budget, floor, max_partial, pricing)
    for key, need, start, running in work:
        if pricing.context is None:
            start = 0
        partial_before = share.num_partial
        if running:
            share.add(key, need, start)
        elif share.offer(key, need, start) is not None:
            assert share.num_partial <= max(max_partial, partial_before)
        given_ = [c.tokens for c in share.claims]
        assert sum(given_) <= budget
        assert all(0 <= c.tokens <= c.need for c in share.claims)
        assert all(c.cost == pricing.of(c.start, c.tokens) for c in share.claims)
        heads = {}
        for c in share.claims:
            heads.setdefault(c.key, c)
        if budget >= len(heads):  # each tenant's oldest prompt advances
            assert all(c.tokens > 0 for c in heads.values())
        for c in share.claims:  # capped at no less than the floor's worth, one token at least
            least = max(1, pricing.tokens_within(c.start, floor)) if floor else c.need
            assert min(c.need, least) <= c.want <= c.need
        cut_short: set = set()
        for c in share.claims:  # within a tenant, a prompt waits for the older ones
            if c.key in cut_short:
                assert c.tokens == 0
            if c.tokens < c.want:
                cut_short.add(c.key)
        # the budget goes unused only where the caps say so, or where what is left of a
        # tenant's share does not pay for its next token
        next_token = max((pricing.of(c.start + c.tokens, 1) for c in share.claims), default=1)
        spent = sum(c.cost for c in share.claims)
        if spent + len(heads) * (next_token - 1) < budget:
            assert all(c.tokens == c.want for c in share.claims)


arrivals = st.lists(
    st.tuples(st.integers(0, 12), st.integers(0, 3), st.integers(1, 150), st.integers(1, 3)),
    min_size=1,
    max_size=10,
)


@settings(max_examples=25, deadline=None)
@given(arrivals, st.integers(16, 48), st.integers(0, 8), st.integers(1, 4))
def test_every_prefill_advances_and_the_budget_holds(
    lora_model_dir, work, budget, threshold, max_partial
):
    engine = LLMEngine(
        model=lora_model_dir,
        max_num_batched_tokens=budget,
        long_prefill_token_threshold=threshold,
        max_num_partial_prefills=max_partial,
        max_num_seqs=8,
        kv_cache_bytes=8 << 20,
        block_size=4,
    )
    pending = sorted(enumerate(work), key=lambda item: item[1][0])
    finished: set[str] = set()
    for step in range(1000):
        while pending and pending[0][1][0] <= step:
            i, (_, tenant, length, max_tokens) = pending.pop(0)
            params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
            ids = [(7 * i + j) % 300 + 10 for j in range(length)]
            engine.add_request(
                EngineRequest(
                    f"r{i}", None, params, prompt_token_ids=ids, fairness_key=f"tenant-{tenant}"
                )  # fmt: skip
            )
        if not pending and not engine.has_unfinished():
            break
        oldest = {}
        for seq in sorted(engine.scheduler.running, key=lambda s: s.admitted_order):
            if seq.status is SequenceStatus.RUNNING and seq.num_uncomputed_tokens > 1:
                oldest.setdefault(seq.fairness_key, seq.request_id)
        batch = engine.scheduler.schedule()
        fed = {seq.request_id: n for seq, n in batch.entries()}
        assert sum(fed.values()) <= budget
        assert engine.scheduler.num_preemptions == 0  # room for all: none is set back
        assert all(rid in fed for rid in oldest.values()), (oldest, fed)
        finished |= {out.request_id for out in engine.run_batch(batch) if out.finished}
    assert finished == {f"r{i}" for i in range(len(work))}
