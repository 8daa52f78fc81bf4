"""Per-request changes to the logits before a token is drawn: logit_bias, min_tokens,
repetition, frequency and presence penalties, and min_p, for a whole batch at once.

Rows with different settings share one set of tensor operations; a row without a setting
carries its neutral value (a bias of 0, a penalty of 1 or 0, min_p 0), which leaves its
logits bit for bit as they were. What the host must know (which parts to run) is fixed when
the tensors are built, so `adjust` and `cut_min_p` neither synchronise with the host nor
branch on device values.

The order is vLLM's: the bias and min_tokens first, then the penalties, all before the
temperature; min_p after it, on the probabilities the draw uses. Each part computes what
the transformers logits processor of the same name computes (RepetitionPenaltyLogitsProcessor,
MinNewTokensLengthLogitsProcessor, SequenceBiasLogitsProcessor for single tokens,
MinPLogitsWarper). Presence and frequency penalties are OpenAI's and count the completion's
tokens only; the repetition penalty counts the prompt's too.

Every change keeps a token at -inf once it is there (a grammar's forbidden token stays
forbidden): -inf times or divided by a positive penalty, minus a finite amount, or plus a
finite bias is still -inf. Only min_tokens adds -inf; where that would leave a row nothing
to draw (its grammar allows only an end-of-sequence token), the row keeps what it had.

The penalties read each sequence's token counts from a TokenCounts (token_counts.py), kept
on the device from step to step; `count` adds the step's drawn tokens to them.
"""

from dataclasses import dataclass

import torch

from .sampling_params import SamplingParams
from .sequence import Sequence
from .token_counts import TokenCounts
from .utils import to_device


@dataclass
class LogitsAdjustments:
    """One step's per-row adjustments on the logits' device; a part no row uses is None."""

    bias: torch.Tensor | None = None  # [rows, vocab] float32: logit_bias; -inf: held back
    repetition_penalty: torch.Tensor | None = None  # [rows, 1] float32; 1 on rows without
    seen: torch.Tensor | None = None  # [rows, vocab] bool: in the prompt or the completion
    frequency_penalty: torch.Tensor | None = None  # [rows, 1] float32
    presence_penalty: torch.Tensor | None = None  # [rows, 1] float32
    output_counts: torch.Tensor | None = None  # [rows, vocab] float32: times in the completion
    min_p: torch.Tensor | None = None  # [rows, 1] float32; 0 on rows without one
    # the penalised rows (their positions in the batch, their TokenCounts rows) to count
    counted: tuple[TokenCounts, torch.Tensor, list[int]] | None = None

    @classmethod
    def from_seqs(
        cls,
        seqs: list[Sequence],
        vocab_size: int,
        device: torch.device,
        token_counts: TokenCounts | None = None,
    ) -> "LogitsAdjustments | None":
        """The batch's adjustments, or None when no row has any. The penalties read
        `token_counts` (a fresh one, filled from the ids, without)."""
        params = [seq.params for seq in seqs]
        if not any(p.adjusts_logits for p in params):
            return None
        rows = len(seqs)

        def column(values: list[float]) -> torch.Tensor:
            return to_device(values, torch.float32, device).view(rows, 1)

        adjustments = cls()
        held = [_held_tokens(seq) for seq in seqs]
        if any(p.logit_bias for p in params) or any(held):
            adjustments.bias = _bias(seqs, held, vocab_size, device)
        if any(p.min_p for p in params):
            adjustments.min_p = column([p.min_p for p in params])
        penalised = [i for i, p in enumerate(params) if _penalised(p)]
        if not penalised:
            return adjustments
        counts = token_counts or TokenCounts(vocab_size, device)
        count_rows = counts.rows([seqs[i] for i in penalised])
        # a row without penalties reads any counts: its neutral values ignore them
        by_row = dict(zip(penalised, count_rows, strict=True))
        index = to_device([by_row.get(i, count_rows[0]) for i in range(rows)], torch.int64, device)
        output = counts.output[index]
        if any(p.repetition_penalty != 1 for p in params):
            adjustments.repetition_penalty = column([p.repetition_penalty for p in params])
            adjustments.seen = counts.prompt[index] | (output > 0)
        if any(p.frequency_penalty or p.presence_penalty for p in params):
            adjustments.frequency_penalty = column([p.frequency_penalty for p in params])
            adjustments.presence_penalty = column([p.presence_penalty for p in params])
            adjustments.output_counts = output
        positions = to_device(penalised, torch.int64, device)
        adjustments.counted = (counts, positions, count_rows)
        return adjustments

    def count(self, tokens: torch.Tensor) -> None:
        """Count the step's drawn tokens ([rows] int64, on the device) for the penalised rows."""
        if self.counted is not None:
            counts, positions, rows = self.counted
            counts.add(rows, tokens[positions])


def adjust(logits: torch.Tensor, adj: LogitsAdjustments) -> torch.Tensor:
    """`logits` ([rows, vocab] float32) with the bias, min_tokens and penalties applied."""
    if adj.bias is not None:
        biased = logits + adj.bias
        # a row min_tokens would leave with nothing to draw keeps its logits
        logits = torch.where((biased > float("-inf")).any(dim=-1, keepdim=True), biased, logits)
    if adj.repetition_penalty is not None:
        assert adj.seen is not None
        penalty = torch.where(adj.seen, adj.repetition_penalty, 1.0)
        logits = torch.where(logits < 0, logits * penalty, logits / penalty)
    if adj.output_counts is not None:
        assert adj.frequency_penalty is not None and adj.presence_penalty is not None
        counts = adj.output_counts
        logits = logits - adj.frequency_penalty * counts - adj.presence_penalty * (counts > 0)
    return logits


def cut_min_p(scaled: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """-inf for the tokens whose probability under `scaled` (the logits after temperature)
    is below min_p times the most likely token's; that one always stays."""
    probs = scaled.softmax(dim=-1)
    threshold = min_p * probs.amax(dim=-1, keepdim=True)
    return scaled.masked_fill(probs < threshold, float("-inf"))


def _penalised(params: SamplingParams) -> bool:
    return bool(
        params.repetition_penalty != 1 or params.frequency_penalty or params.presence_penalty
    )


def _held_tokens(seq: Sequence) -> list[int]:
    """The tokens a sequence may not draw yet: its end-of-sequence and stop tokens, until
    it has min_tokens completion tokens."""
    if seq.num_completion_tokens >= seq.params.min_tokens:
        return []
    return seq.held_token_ids


def _bias(
    seqs: list[Sequence], held: list[list[int]], vocab_size: int, device: torch.device
) -> torch.Tensor:
    """[rows, vocab] float32: each row's logit_bias, and -inf on the tokens it holds back."""
    rows: list[int] = []
    cols: list[int] = []
    values: list[float] = []
    for row, (seq, tokens) in enumerate(zip(seqs, held, strict=True)):
        biases = {**seq.params.logit_bias, **dict.fromkeys(tokens, float("-inf"))}
        rows += [row] * len(biases)
        cols += biases
        values += biases.values()
    bias = torch.zeros(len(seqs), vocab_size, dtype=torch.float32, device=device)
    index = to_device([rows, cols], torch.int64, device)
    return bias.index_put_((index[0], index[1]), to_device(values, torch.float32, device))
