"""Continuous batching: which sequences run in the next step.

A step is either a prefill (new or preempted sequences, whole, within the token budget) or
a decode (one token for every running sequence). Prefill goes first, so newcomers join
the running batch at the next step boundary. When a decode needs a KV block and none is
free, the most recently admitted sequence is preempted: its blocks are freed and it waits
to be recomputed. Admission and preemption look at free blocks only.
"""

from collections import deque

from .block_manager import BlockManager
from .config import EngineConfig
from .sequence import Sequence, SequenceStatus


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager):
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.block_manager = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()
        self.num_preemptions = 0

    def add(self, seq: Sequence):
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> tuple[list[Sequence], bool]:
        """The next batch and whether it is a prefill; empty when nothing can run."""
        batch = self._schedule_prefill()
        if batch:
            return batch, True
        return self._schedule_decode(), False

    def _schedule_prefill(self) -> list[Sequence]:
        batch: list[Sequence] = []
        num_tokens = 0
        # First come, first served: a sequence that does not fit holds back those behind it.
        while self.waiting and self._can_admit(self.waiting[0], batch, num_tokens):
            seq = self.waiting.popleft()
            self.block_manager.allocate(seq)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            batch.append(seq)
            num_tokens += len(seq)
        return batch

    def _can_admit(self, seq: Sequence, batch: list[Sequence], num_tokens: int) -> bool:
        """Every limit a waiting sequence must pass to join the batch; the one place to add
        another (such as a cap on distinct LoRA adapters per batch)."""
        return (
            len(self.running) < self.max_num_seqs
            and num_tokens + len(seq) <= self.max_num_batched_tokens
            and self.block_manager.can_allocate(seq)
        )

    def _schedule_decode(self) -> list[Sequence]:
        batch: list[Sequence] = []
        while self.running:
            seq = self.running.popleft()
            while not self.block_manager.can_append(seq):
                if self.running:
                    self._preempt(self.running.pop())
                else:
                    self._preempt(seq)
                    break
            else:
                self.block_manager.append_slot(seq)
                batch.append(seq)
        self.running.extend(batch)
        return batch

    def _preempt(self, seq: Sequence):
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def finish(self, seq: Sequence):
        """Release a sequence that stopped or was aborted, wherever it is."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
