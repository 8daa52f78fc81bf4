"""The batched logit changes (logits_processors.py) against transformers' logits processors
of the same name, logit for logit: random logits and token histories, rows with different
settings in one batch; and with a grammar's mask, which nothing may undo."""

from typing import cast

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.generation.logits_process import (
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    TopKLogitsWarper,
)

from inference.engine import SamplingParams
from inference.engine.grammar_mask import apply_bitmask
from inference.engine.logits_processors import LogitsAdjustments, adjust, cut_min_p
from inference.engine.sampler import Sampler, SamplingTensors, _cut, sample
from inference.engine.sequence import Sequence, SequenceStatus
from inference.engine.tokenizer import IncrementalDetokenizer

NO_TEXT = cast(IncrementalDetokenizer, None)  # nothing here detokenizes
EOS = 1
CPU = torch.device("cpu")


def make_seq(prompt: list[int], output: list[int], seed: int = 0, **params) -> Sequence:
    """A sequence that has generated `output` after `prompt` and samples its next token."""
    params.setdefault("max_tokens", 64)
    seq = Sequence(
        "r",
        prompt,
        SamplingParams(**params),
        seed=seed,
        detokenizer=NO_TEXT,
        eos_token_ids=frozenset([EOS]),
    )
    seq.token_ids += output
    return seq


def adjusted(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    adjustments = LogitsAdjustments.from_seqs(seqs, logits.shape[-1], CPU)
    assert adjustments is not None
    return adjust(logits, adjustments)


def reference(scores: torch.Tensor, seq: Sequence) -> torch.Tensor:
    """One row through transformers' processors, in the engine's order (vLLM's): bias and
    min_tokens, then the repetition penalty, then OpenAI's frequency and presence penalties
    (transformers has none; their formula is OpenAI's published one)."""
    p = seq.params
    ids = torch.tensor([seq.token_ids])
    scores = scores[None].clone()
    if p.logit_bias:
        bias: list[list[list[int] | float]] = [[[t], b] for t, b in p.logit_bias.items()]
        scores = SequenceBiasLogitsProcessor(bias)(ids, scores)
    if p.min_tokens and seq.held_token_ids:
        scores = MinNewTokensLengthLogitsProcessor(
            seq.num_prompt_tokens, p.min_tokens, seq.held_token_ids
        )(ids, scores)
    if p.repetition_penalty != 1:
        scores = RepetitionPenaltyLogitsProcessor(float(p.repetition_penalty))(ids, scores)
    counts = torch.bincount(
        torch.tensor(seq.token_ids[seq.num_prompt_tokens :], dtype=torch.long),
        minlength=scores.shape[-1],
    ).float()
    if p.frequency_penalty or p.presence_penalty:
        scores = scores - p.frequency_penalty * counts - p.presence_penalty * (counts > 0)
    return scores[0]


# Logits on a coarse grid, so ties, zeros and negative values all come up.
def logits_of(rows: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-12, 13, (rows, vocab), generator=g).float() / 4


VOCAB = 24
token = st.integers(0, VOCAB - 1)
row_params = st.fixed_dictionaries(
    {},
    optional={
        "repetition_penalty": st.sampled_from([1.0, 0.5, 1.3, 2.0]) | st.floats(0.1, 5),
        "frequency_penalty": st.floats(-2, 2),
        "presence_penalty": st.floats(-2, 2),
        "logit_bias": st.dictionaries(token, st.floats(-100, 100), max_size=5),
        "min_tokens": st.integers(0, 6),
        "stop_token_ids": st.lists(token, max_size=2),
        "ignore_eos": st.booleans(),
    },
)
row = st.tuples(st.lists(token, min_size=1, max_size=12), st.lists(token, max_size=10), row_params)


@settings(max_examples=150, deadline=None)
@given(rows=st.lists(row, min_size=1, max_size=6), seed=st.integers(0, 2**31))
def test_a_mixed_batch_equals_each_row_through_transformers(rows, seed):
    seqs = [make_seq(prompt, output, **params) for prompt, output, params in rows]
    logits = logits_of(len(seqs), VOCAB, seed)
    if not any(seq.params.adjusts_logits for seq in seqs):
        assert LogitsAdjustments.from_seqs(seqs, VOCAB, CPU) is None
        return
    got = adjusted(logits, seqs)
    for i, seq in enumerate(seqs):
        assert torch.equal(got[i], reference(logits[i], seq)), f"row {i}: {seq.params}"


@pytest.mark.parametrize("penalty", [0.5, 1.2, 3.0])
def test_repetition_penalty_over_prompt_and_output(penalty):
    logits = logits_of(1, VOCAB, 5)
    seq = make_seq([3, 4, 4], [5, 7], repetition_penalty=penalty)
    expected = RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([seq.token_ids]), logits)
    assert torch.equal(adjusted(logits, [seq]), expected)
    changed = (adjusted(logits, [seq]) != logits)[0].nonzero().flatten().tolist()
    assert set(changed) <= {3, 4, 5, 7}


def test_frequency_and_presence_count_the_completion_only():
    logits = torch.zeros(1, 8)
    seq = make_seq([2, 2, 2], [3, 3, 4], frequency_penalty=0.5, presence_penalty=1.0)
    got = adjusted(logits, [seq])[0].tolist()
    assert got[2] == 0  # in the prompt only
    assert got[3] == -(2 * 0.5 + 1.0) and got[4] == -(0.5 + 1.0)
    assert got[5] == 0


def test_min_tokens_holds_eos_and_stop_tokens_until_reached():
    logits = logits_of(3, VOCAB, 1)
    held = make_seq([5], [6], min_tokens=2, stop_token_ids=[9])
    reached = make_seq([5], [6, 7], min_tokens=2, stop_token_ids=[9])
    ignoring = make_seq([5], [], min_tokens=2, stop_token_ids=[9], ignore_eos=True)
    got = adjusted(logits, [held, reached, ignoring])
    assert got[0, EOS] == float("-inf") and got[0, 9] == float("-inf")
    assert torch.equal(got[1], logits[1])
    assert got[2, 9] == float("-inf") and got[2, EOS] == logits[2, EOS]  # eos is no stop here
    expected = MinNewTokensLengthLogitsProcessor(1, 2, [EOS, 9])(
        torch.tensor([held.token_ids]), logits[:1]
    )
    assert torch.equal(got[:1], expected)


@settings(max_examples=100, deadline=None)
@given(
    min_ps=st.lists(st.sampled_from([0.0, 0.05, 0.1, 0.5, 1.0]) | st.floats(0, 1), min_size=1),
    seed=st.integers(0, 2**31),
)
def test_min_p_equals_transformers_min_p_warper(min_ps, seed):
    scaled = logits_of(len(min_ps), VOCAB, seed)
    got = cut_min_p(scaled, torch.tensor(min_ps).view(-1, 1))
    ids = torch.zeros(1, 1, dtype=torch.long)
    for i, min_p in enumerate(min_ps):
        assert torch.equal(got[i], MinPLogitsWarper(min_p)(ids, scaled[i : i + 1])[0])


@settings(max_examples=100, deadline=None)
@given(top_ks=st.lists(st.integers(1, VOCAB), min_size=1, max_size=6), seed=st.integers(0, 2**31))
def test_top_k_equals_transformers_top_k_warper_ties_included(top_ks, seed):
    logits = logits_of(len(top_ks), VOCAB, seed)
    got = _cut(logits, torch.tensor(top_ks), torch.ones(len(top_ks)))
    ids = torch.zeros(1, 1, dtype=torch.long)
    for i, k in enumerate(top_ks):
        assert torch.equal(got[i], TopKLogitsWarper(k)(ids, logits[i : i + 1])[0])


def test_greedy_rows_pick_the_argmax_of_the_adjusted_logits():
    logits = logits_of(4, VOCAB, 3)
    seqs = [
        make_seq([2], [], temperature=0, logit_bias={17: 100}),
        make_seq([2], [4], temperature=0, repetition_penalty=2.0),
        make_seq([2], [], temperature=0, min_tokens=1, logit_bias={EOS: 100}),
        make_seq([2], [], temperature=0),
    ]
    tokens = Sampler()(logits, seqs).token_ids
    assert tokens[0] == 17
    assert tokens[1] == int(reference(logits[1], seqs[1]).argmax())
    assert tokens[2] != EOS  # held back, whatever its bias
    assert tokens[3] == int(logits[3].argmax())


def test_a_seeded_row_draws_the_same_beside_rows_with_other_settings():
    logits = logits_of(1, VOCAB, 9)
    mine = dict(temperature=0.9, seed=7, min_p=0.05, presence_penalty=0.5)
    alone = [Sampler()(logits, [make_seq([3], [4, 5], **mine)]).token_ids[0] for _ in range(2)]
    others = [
        make_seq([2], [], seed=1, temperature=1.0, repetition_penalty=1.5),
        make_seq([6], [6], seed=2, temperature=0, logit_bias={3: -50}),
    ]
    batch = torch.cat([logits_of(2, VOCAB, 10), logits])
    batched = Sampler()(batch, [*others, make_seq([3], [4, 5], **mine)]).token_ids[-1]
    assert alone == [batched, batched]


def test_logprobs_stay_those_of_the_raw_logits():
    logits = logits_of(1, VOCAB, 4)
    seq = make_seq([2], [], temperature=0, logprobs=2, logit_bias={11: 100})
    out = Sampler()(logits, [seq])
    assert out.token_ids == [11]
    raw = logits[0].log_softmax(dim=-1)
    lp = out.logprobs[0]
    assert lp is not None and lp.logprob == pytest.approx(float(raw[11]))
    assert [t for t, _ in lp.top] == raw.topk(2).indices.tolist()


def test_counts_kept_from_step_to_step_equal_counts_from_the_ids():
    """The sampler's TokenCounts, stepped: a finished sequence's row goes to a new one, a
    token the sampler did not draw is caught, and the rows stay few."""
    sampler = Sampler()

    def running(seed: int, **params) -> Sequence:
        seq = make_seq([3, 4, seed], [], seed=seed, temperature=1.0, **params)
        seq.status = SequenceStatus.RUNNING
        return seq

    seqs = [running(i, frequency_penalty=0.5, repetition_penalty=1.0 + i % 2) for i in range(3)]
    plain = running(9)
    for step in range(8):
        batch = [*seqs, plain]
        out = sampler(logits_of(len(batch), VOCAB, step), batch)
        for seq, token_id in zip(batch, out.token_ids, strict=True):
            seq.token_ids.append(token_id)
        kept = LogitsAdjustments.from_seqs(seqs, VOCAB, CPU, sampler.token_counts)
        fresh = LogitsAdjustments.from_seqs(seqs, VOCAB, CPU)
        assert kept is not None and fresh is not None
        assert torch.equal(cast(torch.Tensor, kept.output_counts), fresh.output_counts)
        assert torch.equal(cast(torch.Tensor, kept.seen), fresh.seen)
        if step == 2:
            seqs[0].status = SequenceStatus.FINISHED
            seqs[0] = running(5, presence_penalty=1.0)
        if step == 4:
            seqs[1].token_ids.append(7)  # drawn elsewhere
    counts = sampler.token_counts
    assert counts is not None and counts.output.shape[0] <= 4


# -- with a grammar's mask -------------------------------------------------------------------


def _bitmask(allowed: list[list[int]], vocab: int) -> torch.Tensor:
    """llguidance's layout: int32 words, bit j of word w allowing token 32 * w + j."""
    words = [[0] * -(-vocab // 32) for _ in allowed]
    for row, tokens in enumerate(allowed):
        for t in tokens:
            words[row][t // 32] |= 1 << (t % 32)
    signed = [[w - (1 << 32) if w >= 1 << 31 else w for w in r] for r in words]
    return torch.tensor(signed, dtype=torch.int32)


@settings(max_examples=100, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.lists(token, min_size=1, max_size=6, unique=True), row, st.booleans()),
        min_size=1,
        max_size=5,
    ),
    seed=st.integers(0, 2**31),
)
def test_no_bias_or_penalty_reallows_a_token_the_grammar_forbids(rows, seed):
    seqs = []
    for _, (prompt, output, params), greedy in rows:
        params = {**params, "temperature": 0 if greedy else 1.0, "min_p": 0.2}
        # what pushes hardest on forbidden tokens: +100 on each, negative penalties on all
        params["logit_bias"] = {t: 100.0 for t in range(VOCAB)}
        seqs.append(make_seq(prompt, output, seed=seed, **params))
    allowed = [tokens for tokens, _, _ in rows]
    logits = logits_of(len(seqs), VOCAB, seed)
    masked = apply_bitmask(logits, list(range(len(seqs))), _bitmask(allowed, VOCAB))
    out = adjusted(masked, seqs)
    for i, tokens in enumerate(allowed):
        forbidden = [t for t in range(VOCAB) if t not in tokens]
        assert (out[i, forbidden] == float("-inf")).all()
    tensors = SamplingTensors.from_seqs(seqs, VOCAB, CPU)
    chosen = sample(masked, logits, tensors)[:, 0].long().tolist()
    assert all(t in tokens for t, tokens in zip(chosen, allowed, strict=True))


def test_min_tokens_yields_where_the_grammar_allows_only_the_end():
    logits = logits_of(2, VOCAB, 2)
    seqs = [make_seq([3], [], temperature=0, min_tokens=4) for _ in range(2)]
    masked = apply_bitmask(logits, [0, 1], _bitmask([[EOS], [EOS, 5]], VOCAB))
    tokens = sample(masked, logits, SamplingTensors.from_seqs(seqs, VOCAB, CPU))[:, 0].tolist()
    assert tokens == [EOS, 5]  # the only token left; else the end is held back


# -- on a GPU ---------------------------------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
MIXED: list[dict] = [
    dict(temperature=0, repetition_penalty=1.4, logit_bias={7: 3.0}),
    dict(temperature=0.8, seed=1, min_p=0.1, presence_penalty=0.6, frequency_penalty=0.2),
    dict(temperature=1.0, seed=2, min_tokens=5, stop_token_ids=[9], top_k=40),
    dict(temperature=0.7, seed=3),
]


def _mixed() -> list[Sequence]:
    return [make_seq([3, 4, 5], [6, 6, 7 + i], seed=i, **p) for i, p in enumerate(MIXED)]


@cuda
def test_on_cuda_the_adjustments_never_synchronise_and_match_the_cpu():
    vocab = 32000
    logits = torch.randn(len(MIXED), vocab, generator=torch.Generator().manual_seed(5)) * 3
    seqs = _mixed()
    on_cpu = sample(logits, logits, SamplingTensors.from_seqs(seqs, vocab, CPU))
    gpu_logits = logits.cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        tensors = SamplingTensors.from_seqs(seqs, vocab, torch.device("cuda"))
        on_gpu = sample(gpu_logits, gpu_logits, tensors)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert on_gpu[:, 0].tolist() == on_cpu[:, 0].tolist()


@cuda
def test_sampling_with_adjustments_replays_in_a_cuda_graph():
    vocab = 32000
    tensors = SamplingTensors.from_seqs(_mixed(), vocab, torch.device("cuda"))
    static_logits = torch.randn(len(MIXED), vocab, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        sample(static_logits, static_logits, tensors)  # warm up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = sample(static_logits, static_logits, tensors)
    for seed in (2, 3):
        fresh = torch.randn(len(MIXED), vocab, generator=torch.Generator().manual_seed(seed))
        static_logits.copy_(fresh.cuda())
        graph.replay()
        assert torch.equal(static_out, sample(static_logits, static_logits, tensors))
