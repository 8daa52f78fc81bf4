"""Chooses each sequence's next token from its logits on the logits' device, and reports
logprobs, with one device-to-host copy per step.

The draw inverts each row's cumulative distribution at one uniform u: the first token whose
cumulative probability exceeds u, which samples exactly from p. u comes from counter-based
noise (sampling_noise.py): a function of the request's seed and the index of the token being
sampled, so a seeded request gets the same tokens whatever else shares its batch, with no
generator objects. The cumulative sum is taken per row in float64, so its rounding neither
depends on the batch nor moves a token's probability by more than about 1e-12. Every row
is handled by the same tensor operations, greedy rows take the exact argmax, and `sample` neither
synchronises with the host nor branches on device values, so it can run in a CUDA graph
(the per-row parameters then live in static buffers).

A row with a grammar (structured output) first has every token its grammar forbids set to
-inf (grammar_mask.py), so everything after chooses among allowed tokens only; the other
rows are untouched. Then each row's logit_bias, min_tokens and penalties, and after the
temperature its min_p (logits_processors.py), then top-k and top-p. Logprobs are those of
the raw logits, before the grammar and any change or cut, as vLLM's default (raw logprobs):
they say what the model wanted, not what it was allowed.
"""

from dataclasses import dataclass

import torch

from . import grammar_mask
from .logits_processors import LogitsAdjustments, adjust, cut_min_p
from .logprobs import TokenLogprob
from .sampling_noise import as_int64_seed, row_keys, uniform
from .sequence import Sequence
from .token_counts import TokenCounts
from .utils import to_device

# A temperature this low is greedy: dividing by it would overflow float32 logits (vLLM does
# the same).
MIN_TEMPERATURE = 1e-5


@dataclass
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[TokenLogprob | None]


@dataclass
class SamplingTensors:
    """The step's per-row sampling parameters on the logits' device, and what the host
    already knows about them (which parts of `sample` to run, how many logprobs). Built
    outside any CUDA graph: a graph runner copies the tensors into its static inputs."""

    temperature: torch.Tensor  # [rows] float32; 1 on greedy rows
    top_p: torch.Tensor  # [rows] float32
    top_k: torch.Tensor  # [rows] int64; the vocabulary size where there is no cut
    seeds: torch.Tensor  # [rows] int64
    steps: torch.Tensor  # [rows] int64: index of the completion token being sampled
    greedy: torch.Tensor  # [rows] bool
    any_random: bool
    any_cut: bool  # a row has top_k or top_p
    logprobs_width: int | None  # the most top logprobs a row asks for; None: no row asks
    adjustments: LogitsAdjustments | None = None  # penalties, biases, min_p; None: no row has any

    @classmethod
    def from_seqs(
        cls,
        seqs: list[Sequence],
        vocab_size: int,
        device: torch.device,
        token_counts: TokenCounts | None = None,
    ) -> "SamplingTensors":
        params = [seq.params for seq in seqs]
        greedy = [p.greedy or p.temperature < MIN_TEMPERATURE for p in params]
        top_k = [min(p.top_k, vocab_size) if p.top_k > 0 else vocab_size for p in params]
        floats = to_device(
            [
                [1.0 if g else p.temperature for p, g in zip(params, greedy, strict=True)],
                [p.top_p for p in params],
            ],
            torch.float32,
            device,
        )
        ints = to_device(
            [
                top_k,
                [as_int64_seed(seq.seed) for seq in seqs],
                [seq.num_completion_tokens for seq in seqs],
                [int(g) for g in greedy],
            ],
            torch.int64,
            device,
        )
        widths = [p.logprobs for p in params if p.logprobs is not None]
        random_rows = [i for i, g in enumerate(greedy) if not g]
        return cls(
            temperature=floats[0],
            top_p=floats[1],
            top_k=ints[0],
            seeds=ints[1],
            steps=ints[2],
            greedy=ints[3].bool(),
            any_random=bool(random_rows),
            any_cut=any(top_k[i] < vocab_size or params[i].top_p < 1 for i in random_rows),
            logprobs_width=max(widths) if widths else None,
            adjustments=LogitsAdjustments.from_seqs(seqs, vocab_size, device, token_counts),
        )


class Sampler:
    """Keeps the penalised sequences' token counts (token_counts.py) from step to step."""

    def __init__(self) -> None:
        self.token_counts: TokenCounts | None = None  # made on the first logits it sees

    def __call__(self, raw_logits: torch.Tensor, seqs: list[Sequence]) -> SamplerOutput:
        logits = raw_logits
        constrained = [(i, g) for i, seq in enumerate(seqs) if (g := seq.grammar) is not None]
        if constrained:
            rows, matchers = zip(*constrained, strict=True)
            logits = grammar_mask.mask_logits(raw_logits, list(rows), list(matchers))
        vocab, device = raw_logits.shape[-1], raw_logits.device
        counts = self.token_counts
        if counts is None or (counts.vocab_size, counts.device) != (vocab, device):
            counts = self.token_counts = TokenCounts(vocab, device)
        tensors = SamplingTensors.from_seqs(seqs, vocab, device, counts)
        packed = sample(logits, raw_logits, tensors)
        if tensors.adjustments is not None:
            tensors.adjustments.count(packed[:, 0].long())
        return unpack(packed.tolist(), seqs, tensors.logprobs_width)  # the step's one copy


def sample(
    logits: torch.Tensor, raw_logits: torch.Tensor, tensors: SamplingTensors
) -> torch.Tensor:
    """The chosen tokens of `logits` ([rows, vocab] float32, grammar masks applied, and
    `tensors.adjustments` applied here), and with `tensors.logprobs_width` W their
    logprobs under `raw_logits`, packed in one float64 [rows, 1] or [rows, 2 + 2W] tensor:
    token, its logprob, W top ids, W top logprobs (float64 holds token ids and float32
    values exactly)."""
    adjustments = tensors.adjustments
    if adjustments is not None:
        logits = adjust(logits, adjustments)
    tokens = logits.argmax(dim=-1)
    if tensors.any_random:
        scaled = logits / tensors.temperature[:, None]
        if adjustments is not None and adjustments.min_p is not None:
            scaled = cut_min_p(scaled, adjustments.min_p)
        if tensors.any_cut:  # top_p may keep another of tied most likely tokens
            scaled = _cut(scaled, tensors.top_k, tensors.top_p)
            largest = scaled.amax(dim=-1, keepdim=True)
        else:  # min_p keeps every most likely token: the greedy one's is the largest
            largest = scaled.gather(1, tokens[:, None])
        drawn = invert_cdf(scaled, largest, uniform(row_keys(tensors.seeds, tensors.steps)))
        tokens = torch.where(tensors.greedy, tokens, drawn)
    columns = [tokens[:, None].double()]
    width = tensors.logprobs_width
    if width is not None:
        logprobs = raw_logits.log_softmax(dim=-1)
        columns.append(logprobs.gather(1, tokens[:, None]).double())
        if width:
            top = logprobs.topk(width, dim=-1)
            columns += [top.indices.double(), top.values.double()]
    return torch.cat(columns, dim=1)


def invert_cdf(scaled: torch.Tensor, largest: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row, the first token whose cumulative softmax(scaled) exceeds u (a token cut to
    -inf has no mass, so it is never the first): a draw from softmax(scaled). `largest` is
    each row's largest value ([rows, 1]); `scaled` is used up."""
    weights = scaled.sub_(largest).exp_()
    cumulative = weights.double().cumsum_(dim=-1)  # cumsum(dtype=) converts far slower on CPU
    target = u[:, None] * cumulative[:, -1:]
    drawn = torch.searchsorted(cumulative, target, right=True).squeeze(1)
    return drawn.clamp_(max=scaled.shape[-1] - 1)


def unpack(rows: list[list[float]], seqs: list[Sequence], width: int | None) -> SamplerOutput:
    """`sample`'s packed result, once on the host, as each sequence's token and logprobs."""
    token_ids = [int(row[0]) for row in rows]
    logprobs: list[TokenLogprob | None] = []
    for token_id, row, seq in zip(token_ids, rows, seqs, strict=True):
        n = seq.params.logprobs
        if n is None or width is None:
            logprobs.append(None)
            continue
        top = [
            (int(t), v) for t, v in zip(row[2 : 2 + n], row[2 + width : 2 + width + n], strict=True)
        ]
        logprobs.append(TokenLogprob(token_id, row[1], top))
    return SamplerOutput(token_ids, logprobs)


def _cut(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """-inf below each row's k-th largest logit (ties with it stay, as in transformers'
    TopKLogitsWarper and vLLM), then outside its nucleus: a token goes once the more likely
    ones already reach top_p (the most likely always stays; top_p 1 cuts nothing)."""
    vocab = logits.shape[-1]
    ordered, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=logits.device)
    cut = ordered < ordered.gather(1, top_k[:, None] - 1)  # 1 <= top_k <= vocab
    sorted_probs = ordered.masked_fill(cut, float("-inf")).softmax(dim=-1)
    before = sorted_probs.cumsum(dim=-1) - sorted_probs
    cut |= (before >= top_p[:, None]) & (rank > 0)[None, :] & (top_p < 1)[:, None]
    return logits.masked_fill(torch.empty_like(cut).scatter_(1, order, cut), float("-inf"))


def prompt_logprobs(seq: Sequence, first_position: int, logits: torch.Tensor) -> None:
    """Append to `seq.prompt_logprobs` the entries of the prompt tokens that follow positions
    `first_position`, `first_position + 1`, ... (one row of `logits` each): the token's
    logprob under the raw logits, its rank, and the top N there (N = params.prompt_logprobs).
    The first prompt token has no context, so its entry is None. One copy to the host."""
    n = seq.params.prompt_logprobs
    assert n is not None, "only for sequences that asked for prompt logprobs"
    if not seq.prompt_logprobs:
        seq.prompt_logprobs.append(None)
    logprobs = logits.log_softmax(dim=-1)
    targets = seq.token_ids[first_position + 1 : first_position + 1 + logits.shape[0]]
    index = to_device([targets], torch.int64, logits.device).view(-1, 1)
    chosen = logprobs.gather(1, index)
    ranks = (logprobs > chosen).sum(dim=-1, keepdim=True).add_(1)
    columns = [chosen.double(), ranks.double()]
    if n:
        top = logprobs.topk(n, dim=-1)
        columns += [top.indices.double(), top.values.double()]
    for token_id, row in zip(targets, torch.cat(columns, dim=1).tolist(), strict=True):
        best = [(int(t), v) for t, v in zip(row[2 : 2 + n], row[2 + n : 2 + 2 * n], strict=True)]
        seq.prompt_logprobs.append(TokenLogprob(token_id, row[0], best, rank=int(row[1])))
