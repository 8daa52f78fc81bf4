"""Continuous batching: which sequences run in the next step.

A step is either a prefill (new or preempted sequences, whole, within the token budget) or
a decode (one token for every running sequence). Prefill goes first, so newcomers join
the running batch at the next step boundary. When a decode needs a KV block and none is
free, the most recently admitted sequence is preempted: its blocks are freed and it waits
to be recomputed. Admission and preemption look at free blocks only.

Waiting sequences are considered in one order (`_admission_order`): preempted ones first,
then round-robin over fairness keys (tenants), oldest first within a key, so one tenant's
burst cannot fill the batch ahead of another's earlier requests. A sequence whose LoRA
adapter cannot have a device slot yet is skipped, never holding back those behind it; the
LoRA manager makes sure such an adapter gets the next slot that frees (no starvation).
"""

from collections import deque

from .block_manager import BlockManager
from .config import EngineConfig
from .lora.manager import LoRAManager
from .sequence import Sequence, SequenceStatus


class Scheduler:
    def __init__(
        self,
        config: EngineConfig,
        block_manager: BlockManager,
        lora_manager: LoRAManager | None = None,
    ):
        assert config.max_num_batched_tokens is not None  # resolved by EngineConfig
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.block_manager = block_manager
        self.lora = lora_manager  # None when LoRA is off
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        if self.lora is not None:
            self.lora.add_request(seq)
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> tuple[list[Sequence], bool]:
        """The next batch and whether it is a prefill; empty when nothing can run."""
        batch = self._schedule_prefill()
        if batch:
            return batch, True
        return self._schedule_decode(), False

    def _admission_order(self) -> list[Sequence]:
        """The one place that orders waiting sequences: preempted ones (they were running)
        first, then one sequence per fairness key in turn, keys in the order of their
        oldest waiting sequence, each key's sequences in arrival order."""
        preempted: list[Sequence] = []
        by_key: dict[str | None, deque[Sequence]] = {}
        for seq in self.waiting:
            if seq.num_preemptions:
                preempted.append(seq)
            else:
                by_key.setdefault(seq.fairness_key, deque()).append(seq)
        order = preempted
        queues = list(by_key.values())
        while queues:
            order.extend(q.popleft() for q in queues)
            queues = [q for q in queues if q]
        return order

    def _schedule_prefill(self) -> list[Sequence]:
        if not self.waiting:
            return []
        batch: list[Sequence] = []
        num_tokens = 0
        if self.lora is not None:
            self.lora.begin_schedule()
        for seq in self._admission_order():
            # A sequence that does not fit holds back those behind it, so a long prompt is
            # never starved by short ones; one whose adapter is not ready is only skipped.
            if not self._can_admit(seq, batch, num_tokens):
                break
            if self.lora is not None and not self.lora.acquire(seq):
                continue
            self.block_manager.allocate(seq)
            self._set_status(seq, SequenceStatus.RUNNING)
            self.running.append(seq)
            batch.append(seq)
            num_tokens += len(seq)
        if batch:
            admitted = set(map(id, batch))
            self.waiting = deque(s for s in self.waiting if id(s) not in admitted)
        return batch

    def _can_admit(self, seq: Sequence, batch: list[Sequence], num_tokens: int) -> bool:
        """Every budget a waiting sequence must fit to join the batch. The per-batch cap on
        distinct LoRA adapters needs no check here: each adapter in the batch holds one of
        the `max_loras` device slots, which `LoRAManager.acquire` hands out."""
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

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        self._set_status(seq, SequenceStatus.WAITING)
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def finish(self, seq: Sequence) -> None:
        """Release a sequence that stopped or was aborted, wherever it is."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        self._set_status(seq, SequenceStatus.FINISHED)

    def _set_status(self, seq: Sequence, status: SequenceStatus) -> None:
        """Every status change passes here, so the LoRA manager's counts of waiting and
        running requests per adapter (what it may evict) can never drift."""
        old, seq.status = seq.status, status
        if self.lora is not None and old is not status:
            self.lora.status_changed(seq, old, status)
