"""How often each token is in each penalised sequence, kept on the logits' device from step
to step, so the penalties read counts instead of rebuilding them from every token id.

A sequence gets a row of one [rows, vocab] tensor (its completion's counts) and of a
[rows, vocab] mask (its prompt's tokens) the first time it samples with a penalty, filled
from its ids once. After each draw one scatter-add counts the step's tokens, on the device,
for every row at once. The host remembers how many completion tokens each row holds, so a
row that missed a token (the sequence went its way without this sampler) is refilled from
the ids instead of read stale.

A row is taken back once its sequence is no longer running (finished, preempted, gone); a
preempted sequence gets a row again, refilled, when it next samples. The tensors grow by doubling
and are never shrunk: at most about as many rows as sequences run at once.
"""

import weakref

import torch

from .sequence import Sequence, SequenceStatus
from .utils import to_device


class TokenCounts:
    def __init__(self, vocab_size: int, device: torch.device):
        self.vocab_size = vocab_size
        self.device = device
        self.output = torch.zeros(0, vocab_size, dtype=torch.float32, device=device)
        self.prompt = torch.zeros(0, vocab_size, dtype=torch.bool, device=device)
        self._owners: list[weakref.ref[Sequence] | None] = []
        self._counted: list[int] = []  # completion tokens each row holds
        # id(sequence) -> its row; an id can come back after its sequence is gone, so a row
        # counts as a sequence's only while its owner is that very sequence
        self._rows: dict[int, int] = {}

    def rows(self, seqs: list[Sequence]) -> list[int]:
        """The rows of `seqs`, each up to date with its sequence's tokens."""
        batch = {id(seq) for seq in seqs}
        rows = []
        for seq in seqs:
            row = self._rows.get(id(seq))
            if row is None or self._owner(row) is not seq:
                row = self._take_row(seq, batch)
            if self._counted[row] != seq.num_completion_tokens:
                self._fill(row, seq)
            rows.append(row)
        return rows

    def add(self, rows: list[int], tokens: torch.Tensor) -> None:
        """Count each row's newly drawn token (`tokens`: one per row, int64 on the device)."""
        index = to_device(rows, torch.int64, self.device)
        ones = torch.ones(len(rows), dtype=torch.float32, device=self.device)
        self.output.index_put_((index, tokens), ones, accumulate=True)
        for row in rows:
            self._counted[row] += 1

    def _owner(self, row: int) -> Sequence | None:
        ref = self._owners[row]
        return None if ref is None else ref()

    def _take_row(self, seq: Sequence, batch: set[int]) -> int:
        free = next((r for r in range(len(self._owners)) if self._is_free(r, batch)), None)
        if free is None:
            free = len(self._owners)
            self._grow(max(1, 2 * free))
        stale = [key for key, row in self._rows.items() if row == free]
        for key in stale:
            del self._rows[key]
        self._owners[free] = weakref.ref(seq)
        self._counted[free] = -1  # filled next
        self._rows[id(seq)] = free
        return free

    def _is_free(self, row: int, batch: set[int]) -> bool:
        """Its sequence is gone, finished, or waiting (preempted) and not in this batch."""
        owner = self._owner(row)
        return (
            owner is None
            or owner.is_finished
            or (owner.status is SequenceStatus.WAITING and id(owner) not in batch)
        )

    def _grow(self, capacity: int) -> None:
        more = capacity - len(self._owners)
        self.output = torch.cat([self.output, self.output.new_zeros(more, self.vocab_size)])
        self.prompt = torch.cat([self.prompt, self.prompt.new_zeros(more, self.vocab_size)])
        self._owners += [None] * more
        self._counted += [0] * more

    def _fill(self, row: int, seq: Sequence) -> None:
        """A row from its sequence's ids: its prompt's tokens and its completion's counts."""
        prompt = to_device(seq.token_ids[: seq.num_prompt_tokens], torch.int64, self.device)
        completion = to_device(seq.token_ids[seq.num_prompt_tokens :], torch.int64, self.device)
        self.prompt[row] = False
        self.prompt[row, prompt] = True
        self.output[row] = 0
        ones = torch.ones(len(completion), dtype=torch.float32, device=self.device)
        self.output[row].index_put_((completion,), ones, accumulate=True)
        self._counted[row] = seq.num_completion_tokens
