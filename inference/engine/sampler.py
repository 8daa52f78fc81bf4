"""Chooses each sequence's next token from its logits, and reports logprobs.

Random choices draw from the request's own torch.Generator, one row at a time, so a
seeded request gets the same tokens whatever else shares its batch. The draw uses the
exponential race (argmax of p / E with E ~ Exp(1)), which samples exactly from p.

A row with a grammar (structured output) first has every token its grammar forbids set to
-inf (grammar_mask.py), so temperature, top-k and top-p choose among allowed tokens only;
the other rows are untouched. Logprobs are those of the raw logits, before the grammar and
any cut, as in vLLM: they say what the model wanted, not what it was allowed.
"""

from dataclasses import dataclass

import torch

from . import grammar_mask
from .outputs import TokenLogprob
from .sampling_params import SamplingParams
from .sequence import Sequence


@dataclass
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[TokenLogprob | None]


class Sampler:
    def __call__(self, raw_logits: torch.Tensor, seqs: list[Sequence]) -> SamplerOutput:
        logits = raw_logits
        constrained = [(i, g) for i, seq in enumerate(seqs) if (g := seq.grammar) is not None]
        if constrained:
            rows, matchers = zip(*constrained, strict=True)
            logits = grammar_mask.mask_logits(raw_logits, list(rows), list(matchers))
        tokens = logits.argmax(dim=-1)
        random_rows = [i for i, seq in enumerate(seqs) if not seq.params.greedy]
        if random_rows:
            probs = self._probs(logits[random_rows], [seqs[i].params for i in random_rows])
            for row, i in enumerate(random_rows):
                race = torch.empty_like(probs[row]).exponential_(generator=seqs[i].generator)
                tokens[i] = (probs[row] / race).argmax()
        token_ids = tokens.tolist()
        return SamplerOutput(token_ids, self._logprobs(raw_logits, token_ids, seqs))

    @staticmethod
    def _probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
        """Softmax at each row's temperature, after its top-k and top-p cuts."""
        temperature = logits.new_tensor([p.temperature for p in params])
        logits = logits / temperature[:, None]
        top_k = [p.top_k for p in params]
        top_p = [p.top_p for p in params]
        if any(k > 0 for k in top_k) or any(p < 1 for p in top_p):
            vocab = logits.shape[-1]
            ordered, order = logits.sort(dim=-1, descending=True)
            rank = torch.arange(vocab, device=logits.device)
            k = logits.new_tensor([k if k > 0 else vocab for k in top_k])
            cut = rank[None, :] >= k[:, None]
            ordered = ordered.masked_fill(cut, float("-inf"))
            sorted_probs = ordered.softmax(dim=-1)
            # drop a token once the more likely ones already reach top_p (the first always stays)
            before = sorted_probs.cumsum(dim=-1) - sorted_probs
            cut |= before >= logits.new_tensor(top_p)[:, None]
            cut[:, 0] = False
            logits = logits.masked_fill(
                torch.empty_like(cut).scatter_(1, order, cut), float("-inf")
            )
        return logits.softmax(dim=-1)

    @staticmethod
    def _logprobs(
        logits: torch.Tensor, token_ids: list[int], seqs: list[Sequence]
    ) -> list[TokenLogprob | None]:
        """Log-softmax of the raw logits (before temperature or cuts), as the model sees it."""
        out: list[TokenLogprob | None] = [None] * len(seqs)
        wanted = {i: n for i, seq in enumerate(seqs) if (n := seq.params.logprobs) is not None}
        if not wanted:
            return out
        rows = list(wanted)
        logprobs = logits[rows].log_softmax(dim=-1)
        width = max(wanted.values())
        top = logprobs.topk(width, dim=-1) if width else None
        chosen = logprobs.gather(
            1, logits.new_tensor([token_ids[i] for i in rows], dtype=torch.long)[:, None]
        )[:, 0].tolist()
        for row, (i, n) in enumerate(wanted.items()):
            best = [] if top is None else top.indices[row, :n].tolist()
            best_values = [] if top is None else top.values[row, :n].tolist()
            out[i] = TokenLogprob(
                token_ids[i], chosen[row], list(zip(best, best_values, strict=True))
            )
        return out


def prompt_logprobs(seq: Sequence, first_position: int, logits: torch.Tensor) -> None:
    """Append to `seq.prompt_logprobs` the entries of the prompt tokens that follow positions
    `first_position`, `first_position + 1`, ... (one row of `logits` each): the token's
    logprob under the raw logits, its rank, and the top N there (N = params.prompt_logprobs).
    The first prompt token has no context, so its entry is None."""
    n = seq.params.prompt_logprobs
    assert n is not None, "only for sequences that asked for prompt logprobs"
    if not seq.prompt_logprobs:
        seq.prompt_logprobs.append(None)
    logprobs = logits.log_softmax(dim=-1)
    targets = seq.token_ids[first_position + 1 : first_position + 1 + logits.shape[0]]
    index = torch.tensor(targets, dtype=torch.long, device=logits.device)[:, None]
    chosen = logprobs.gather(1, index)
    ranks = (logprobs > chosen).sum(dim=-1).add_(1).tolist()
    top = logprobs.topk(n, dim=-1) if n else None
    for row, (token_id, value, rank) in enumerate(
        zip(targets, chosen[:, 0].tolist(), ranks, strict=True)
    ):
        best = [] if top is None else top.indices[row].tolist()
        best_values = [] if top is None else top.values[row].tolist()
        seq.prompt_logprobs.append(
            TokenLogprob(token_id, value, list(zip(best, best_values, strict=True)), rank=rank)
        )
