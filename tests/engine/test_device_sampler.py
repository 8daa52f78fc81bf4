"""The sampler on fixed logits: counter-based noise, per-row parameters as tensors, one
host copy per step. No model needed; the engine-level checks are in test_sampling.py."""

from typing import cast

import pytest
import torch

from inference.engine import SamplingParams
from inference.engine.sampler import Sampler, SamplingTensors, sample
from inference.engine.sampling_noise import as_int64_seed, row_keys, uniform
from inference.engine.sequence import Sequence
from inference.engine.tokenizer import IncrementalDetokenizer

NO_TEXT = cast(IncrementalDetokenizer, None)  # the sampler never detokenizes
MASK64 = (1 << 64) - 1


def make_seq(seed: int, step: int = 0, **params) -> Sequence:
    """A sequence about to sample its completion token number `step`."""
    seq = Sequence("r", [0], SamplingParams(**params), seed=seed, detokenizer=NO_TEXT)
    seq.token_ids += [1] * step
    return seq


def random_logits(rows: int, vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


# -- the noise -------------------------------------------------------------------------------


def _splitmix_mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def _reference_uniform(seed: int, step: int) -> float:
    """splitmix64 in plain Python integers, as sampling_noise.py documents it."""
    gamma = 0x9E3779B97F4A7C15
    key = _splitmix_mix((_splitmix_mix((seed + gamma) & MASK64) + step) & MASK64)
    bits = _splitmix_mix((key + gamma) & MASK64) >> 12
    return (2 * bits + 1) / 2**53


def test_noise_is_splitmix64_computed_in_int64_tensors():
    seeds = [0, 1, 42, 2**63 - 1, -1, -(2**63), 2**64 + 5]
    steps = [0, 1, 7, 1000, 3, 2**20, 0]
    keys = row_keys(
        torch.tensor([as_int64_seed(s) for s in seeds]), torch.tensor(steps, dtype=torch.int64)
    )
    got = uniform(keys)
    expected = [_reference_uniform(s, t) for s, t in zip(seeds, steps, strict=True)]
    assert got.tolist() == expected  # exact: 52 bits fit float64


def test_noise_is_uniform_in_the_open_interval():
    seeds, steps = torch.arange(64).repeat_interleave(4096), torch.arange(4096).repeat(64)
    u = uniform(row_keys(seeds, steps)).view(64, 4096)
    assert u.min() > 0 and u.max() < 1
    assert abs(u.mean().item() - 0.5) < 0.002  # sd of the mean: 0.29 / 512
    # each of 16 bins holds 1/16 of the draws (expected 16384 each, sd about 124)
    counts = torch.bincount((u * 16).long().flatten(), minlength=16).double()
    assert ((counts - 16384).abs() < 600).all()
    # neighbouring seeds and neighbouring steps are not correlated
    flat = (u - 0.5).flatten()
    for lag in (1, 4096):
        assert abs((flat[:-lag] * flat[lag:]).mean().item()) < 0.002


def test_seeds_equal_modulo_two_to_the_64_draw_the_same():
    logits = random_logits(1, 50)
    huge = Sampler()(logits, [make_seq(2**64 + 9, temperature=1.0)]).token_ids
    small = Sampler()(logits, [make_seq(9, temperature=1.0)]).token_ids
    assert huge == small


# -- determinism ------------------------------------------------------------------------------


def test_a_seeded_row_draws_the_same_whatever_its_batch_and_row():
    logits = random_logits(6, 300)
    kinds = [
        dict(temperature=0.9, top_p=0.95, top_k=50),
        dict(temperature=1.3),
        dict(temperature=0),
        dict(temperature=0.7, top_k=5, logprobs=3),
        dict(temperature=1.0, top_p=0.5),
        dict(temperature=2.0, logprobs=0),
    ]

    def run(order: list[int], step: int) -> dict[int, int]:
        seqs = [make_seq(100 + i, step, **kinds[i]) for i in order]
        out = Sampler()(logits[order], seqs)
        return dict(zip(order, out.token_ids, strict=True))

    for step in (0, 1, 5):
        alone = {i: run([i], step)[i] for i in range(6)}
        assert run(list(range(6)), step) == alone
        assert run([5, 3, 1, 0, 4, 2], step) == alone
        assert run([4, 0], step) == {i: alone[i] for i in (4, 0)}


def test_steps_and_seeds_draw_afresh():
    """Flat logits: every token equally likely, so the draws show the noise itself."""
    flat = torch.zeros(1, 1000)
    by_step = [
        Sampler()(flat, [make_seq(7, step, temperature=1.0)]).token_ids[0] for step in range(40)
    ]
    by_seed = [
        Sampler()(flat, [make_seq(seed, 3, temperature=1.0)]).token_ids[0] for seed in range(40)
    ]
    assert len(set(by_step)) > 35 and len(set(by_seed)) > 35


# -- the distribution -------------------------------------------------------------------------


def _chi_square(draws: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(draws, minlength=len(probs)).double()
    expected = probs.double() * len(draws)
    return (((counts - expected) ** 2) / expected).sum().item()


# chi-square with 5 degrees of freedom exceeds 20.5 with probability 0.001; the draws are
# seeded, so the outcome is fixed, not flaky
CHI2_5_DF_P001 = 20.5


@pytest.mark.parametrize("temperature", [1.0, 0.6, 1.7])
def test_draws_follow_softmax_of_logits_over_temperature(temperature):
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    n = 6000
    seqs = [make_seq(seed, seed % 11, temperature=temperature) for seed in range(n)]
    draws = torch.tensor(Sampler()(logits.expand(n, -1), seqs).token_ids)
    probs = (logits / temperature).softmax(-1)
    assert _chi_square(draws, probs) < CHI2_5_DF_P001


def test_one_seed_over_many_steps_follows_the_softmax():
    logits = torch.tensor([[1.5, 1.0, 0.2, 0.0, -0.5, -2.0]])
    draws = torch.tensor(
        [
            Sampler()(logits, [make_seq(2024, step, temperature=1.0)]).token_ids[0]
            for step in range(3000)
        ]
    )
    assert _chi_square(draws, logits[0].softmax(-1)) < CHI2_5_DF_P001


def test_top_k_and_top_p_cut_per_row_in_one_batch():
    probs = torch.tensor([0.35, 0.25, 0.2, 0.1, 0.06, 0.04])
    kinds = [
        (dict(top_k=2), {0, 1}),
        (dict(top_p=0.5), {0, 1}),  # 0.35 falls short of 0.5, so 0.25 joins, then it is reached
        (dict(top_p=0.3), {0}),
        (dict(top_k=4, top_p=0.99), {0, 1, 2, 3}),  # the top-k cut comes first
        (dict(), {0, 1, 2, 3, 4, 5}),
    ]
    n = 400
    seqs = [make_seq(i, **kinds[i % len(kinds)][0]) for i in range(n * len(kinds))]
    logits = probs.log().expand(len(seqs), -1)
    tokens = Sampler()(logits, seqs).token_ids
    for k, (_, allowed) in enumerate(kinds):
        assert set(tokens[k :: len(kinds)]) == allowed


def test_tied_most_likely_tokens_under_a_tight_top_p_draw_one_of_them():
    """top_p keeps one of two tied leaders, whichever its sort put first; the draw lands on
    the one kept, never on a cut token nor on nothing."""
    logits = torch.full((1, 64), -3.0)
    logits[0, 20] = logits[0, 41] = 5.0
    draws = {
        Sampler()(logits, [make_seq(seed, temperature=1.0, top_p=0.1)]).token_ids[0]
        for seed in range(50)
    }
    assert len(draws) == 1 and draws <= {20, 41}


def test_top_k_draws_follow_the_renormalised_softmax():
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0, 4.0, -9.0])
    n = 5000
    seqs = [make_seq(seed, temperature=0.8, top_k=6) for seed in range(n)]
    draws = torch.tensor(Sampler()(logits.expand(n, -1), seqs).token_ids)
    kept = logits.topk(6).indices
    assert set(draws.tolist()) <= set(kept.tolist())
    as_rank = (draws[:, None] == kept[None, :]).long().argmax(-1)  # token -> its rank in kept
    assert _chi_square(as_rank, (logits[kept] / 0.8).softmax(-1)) < CHI2_5_DF_P001


# -- greedy -----------------------------------------------------------------------------------


def test_greedy_rows_take_the_exact_argmax():
    logits = random_logits(5, 500, seed=3)
    seqs = [
        make_seq(1, temperature=0),
        make_seq(2, temperature=1.5, top_k=1),
        make_seq(3, temperature=1e-7),  # under MIN_TEMPERATURE: greedy, not an overflow
        make_seq(4, temperature=1.0),
        make_seq(5, temperature=0, top_p=0.1),
    ]
    tokens = Sampler()(logits, seqs).token_ids
    argmax = logits.argmax(-1).tolist()
    assert [tokens[i] for i in (0, 1, 2, 4)] == [argmax[i] for i in (0, 1, 2, 4)]


def test_an_all_greedy_batch_draws_no_noise(monkeypatch):
    import inference.engine.sampler as sampler_module

    def no_noise(*args):
        raise AssertionError("a greedy batch needs no noise")

    monkeypatch.setattr(sampler_module, "uniform", no_noise)
    logits = random_logits(3, 100)
    tokens = Sampler()(logits, [make_seq(i, temperature=0) for i in range(3)]).token_ids
    assert tokens == logits.argmax(-1).tolist()


# -- logprobs ---------------------------------------------------------------------------------


def test_logprobs_are_log_softmax_of_the_raw_logits():
    logits = random_logits(4, 200, seed=5)
    seqs = [
        make_seq(1, temperature=0.5, top_k=3, logprobs=5),
        make_seq(2, temperature=0),
        make_seq(3, temperature=1.0, logprobs=0),
        make_seq(4, temperature=0, logprobs=20),
    ]
    out = Sampler()(logits, seqs)
    expected = logits.log_softmax(-1)
    assert out.logprobs[1] is None
    for i, n in ((0, 5), (2, 0), (3, 20)):
        lp = out.logprobs[i]
        assert lp is not None and lp.token_id == out.token_ids[i]
        assert lp.logprob == expected[i, lp.token_id].item()  # float32 values, exactly
        values, ids = expected[i].topk(n)
        assert lp.top == list(zip(ids.tolist(), values.tolist(), strict=True))


# -- host copies ------------------------------------------------------------------------------


def test_a_step_copies_to_the_host_once(monkeypatch):
    """Every way a tensor reaches Python is counted while the sampler runs: one copy."""
    copies: list[str] = []
    for name in ("tolist", "item", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _name=name, _original=original, **kwargs):
            copies.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    logits = random_logits(6, 300)
    seqs = [
        make_seq(i, i, temperature=0.8 * (i % 2), top_k=20 if i % 3 else -1, logprobs=i or None)
        for i in range(6)
    ]
    out = Sampler()(logits, seqs)
    assert copies == ["tolist"]
    assert len(out.token_ids) == 6


# -- on a GPU ---------------------------------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _tensors(seqs: list[Sequence], vocab: int, device: str) -> SamplingTensors:
    return SamplingTensors.from_seqs(seqs, vocab, torch.device(device))


@cuda
def test_on_cuda_it_never_synchronises_and_draws_what_the_cpu_draws():
    logits = random_logits(8, 32000, seed=11)
    seqs = [
        make_seq(
            i, 3 * i, temperature=[0, 0.7, 1.0, 1.2][i % 4], top_p=0.9, logprobs=[None, 4][i % 2]
        )
        for i in range(8)
    ]
    on_cpu = sample(logits, logits, _tensors(seqs, 32000, "cpu"))
    gpu_logits = logits.cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        tensors = _tensors(seqs, 32000, "cuda")
        on_gpu = sample(gpu_logits, gpu_logits, tensors)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    # the same uniform bit for bit, so the same tokens: only a uniform within rounding of a
    # cumulative boundary could differ, and among 8 rows that is far too unlikely to expect
    assert on_gpu[:, 0].tolist() == on_cpu[:, 0].tolist()
    assert torch.allclose(on_gpu[:, 1:].cpu(), on_cpu[:, 1:], atol=1e-5)


@cuda
def test_sampling_replays_in_a_cuda_graph():
    vocab = 32000
    seqs = [make_seq(i, i, temperature=[0, 0.9][i % 2], top_k=40, logprobs=2) for i in range(4)]
    tensors = _tensors(seqs, vocab, "cuda")
    static_logits = random_logits(4, vocab, seed=1).cuda()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        sample(static_logits, static_logits, tensors)  # warm up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = sample(static_logits, static_logits, tensors)
    for seed in (2, 3):
        fresh = random_logits(4, vocab, seed=seed).cuda()
        static_logits.copy_(fresh)
        graph.replay()
        assert torch.equal(static_out, sample(fresh, fresh, tensors))
