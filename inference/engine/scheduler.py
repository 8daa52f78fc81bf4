"""Continuous batching with chunked prefill: which sequences feed which tokens next step.

Every step has a token budget (`max_num_batched_tokens`). Running sequences that decode
come first, their newest token each. What is left goes to prefills, each chunk counted at
its cost (prefill_cost.py: on cpu a token deep in a long prompt counts for more), shared
by tenant (fairness key, prefill_share.py): the prompts still prefilling and the waiting
ones that can start (taken in admission order) split it equally between tenants, a
tenant's own prompts in turn, and beside another tenant's short prompt a prompt feeds no
more than `long_prefill_token_threshold`. So a long prompt is prefilled over several
steps while running streams keep producing a token each step, it advances in every step,
and another tenant's short request starts in the next step, in a step about as short as
its own. Waiting sequences stay in line when starting them would leave more than
`max_num_partial_prefills` prompts part-way (one that finishes in its step never waits for
that). With `enable_chunked_prefill` off, there are no shares: the prompts under way, then
waiting ones, are admitted only whole and the budget counts prefill tokens only. A sequence
admitted gets KV blocks for all its tokens at once, sharing the blocks of the longest prefix
the cache already holds (block_manager.py), and only the rest is fed.

Priorities: all of this happens one priority class at a time, lowest value first, so a
waiting request of a better class is served before running ones of worse classes, and
when it lacks a sequence slot or KV blocks, running sequences of worse classes are
preempted for it (the newest first). When a decode needs a block and none is free, the
newest running sequence of the worst class not yet scheduled in this step is preempted: its
blocks are freed (named ones stay cached, so its recompute is mostly a cache hit) and it
waits to be recomputed. Either way background work goes first.

Background work (classes worse than Priority.DEFAULT, the tenants' class: the quality
gate's scoring) takes only what tenants' traffic leaves of a step, at most
`background_tokens_per_step` tokens, and none in a step that would otherwise only decode
tenants' sequences. Order alone is not enough: a tenant's token waits for the whole step,
so background chunks filling the budget slow every token of a tenant's request, and a
tenant that arrives waits for the background step under way. Decode-only steps are the
cheap ones (matrix-vector work on cpu, a replayed graph on cuda); any prefill token makes
them a different, slower kind of step. A budget of 0 turns this off: background work
fills whatever tenants leave, like any class. Without chunked prefill, background work
alone takes the whole budget (a prompt is fed whole or not at all).
"""

import itertools
from collections import deque
from dataclasses import dataclass, field

from .block_manager import BlockManager
from .config import EngineConfig
from .lora.manager import LoRAManager
from .prefill_share import Claim, PrefillShare
from .request import Priority
from .sequence import Sequence, SequenceStatus


def is_background(priority: int) -> bool:
    """The platform's own work: any class worse than the one tenants' traffic runs at."""
    return priority > Priority.DEFAULT


@dataclass
class ScheduledBatch:
    """One step's work: prefill chunks first, then decodes (one token each)."""

    prefills: list[tuple[Sequence, int]] = field(default_factory=list)  # (seq, tokens fed)
    decodes: list[Sequence] = field(default_factory=list)

    @property
    def seqs(self) -> list[Sequence]:
        return [seq for seq, _ in self.prefills] + self.decodes

    def entries(self) -> list[tuple[Sequence, int]]:
        return self.prefills + [(seq, 1) for seq in self.decodes]

    def __bool__(self) -> bool:
        return bool(self.prefills or self.decodes)


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
        assert config.background_tokens_per_step is not None  # resolved by EngineConfig
        self.background_tokens_per_step = config.background_tokens_per_step
        self.chunked_prefill = config.enable_chunked_prefill
        assert config.long_prefill_token_threshold is not None  # resolved by EngineConfig
        self.long_prefill_threshold = config.long_prefill_token_threshold
        self.max_num_partial_prefills = config.max_num_partial_prefills
        self.prefill_cost = config.prefill_cost
        self.block_manager = block_manager
        self.lora = lora_manager  # None when LoRA is off
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in the order they were admitted
        self.num_preemptions = 0
        self._admissions = itertools.count()
        self._scheduled: set[int] = set()  # ids of the sequences in this step's batch

    def add(self, seq: Sequence) -> None:
        if self.lora is not None:
            self.lora.add_request(seq)
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        """The next step's batch; empty when nothing can run."""
        batch = ScheduledBatch()
        self._scheduled = set()  # those in `batch` are never preempted for this step
        budget = self.max_num_batched_tokens
        if self.waiting and self.lora is not None:
            self.lora.begin_schedule()
        classes = sorted({s.priority for s in self.running} | {s.priority for s in self.waiting})
        tenants = [p for p in classes if not is_background(p)]
        for priority in tenants:
            budget = self._schedule_class(priority, budget, batch)
        share = self._background_share(budget, batch)
        if share is not None:  # one share for every background class together
            for priority in classes[len(tenants) :]:
                share = self._schedule_class(priority, share, batch)
        return batch

    def _background_share(self, budget: int, batch: ScheduledBatch) -> int | None:
        """The tokens background work may feed in this step, once tenants' traffic has its
        part (`batch` so far); None: nothing at all, not even a decode."""
        cap = self.background_tokens_per_step
        if cap == 0:
            return budget  # no background budget: what tenants leave, as for any class
        if batch.decodes and not batch.prefills:
            return None  # a step of tenants' decodes stays one
        if not batch and not self.chunked_prefill:
            return budget  # alone, a prompt is fed whole
        return min(budget, cap) or None

    def _schedule_class(self, priority: int, budget: int, batch: ScheduledBatch) -> int:
        budget = self._schedule_decodes(priority, budget, batch)
        if self.chunked_prefill:
            return self._schedule_prefills(priority, budget, batch)
        budget = self._schedule_running_prefills(priority, budget, batch)
        order = self._admission_order(priority)
        return self._admit_waiting([(seq, len(seq)) for seq in order], budget, batch)

    def mark_computed(self, batch: ScheduledBatch) -> None:
        """After the forward: the batch's tokens are in the cache (and blocks that fell
        behind a sliding window can go)."""
        for seq, n in batch.entries():
            seq.num_computed_tokens += n
            self.block_manager.release_behind_window(seq)

    def _add_to(self, batch: ScheduledBatch, seq: Sequence, n: int) -> None:
        """Put a sequence's next `n` tokens in the batch. The blocks they fill are named now,
        so a sequence admitted after it in this very step can share them."""
        if seq.num_uncomputed_tokens == 1 and seq.num_computed_tokens:
            batch.decodes.append(seq)
        else:
            batch.prefills.append((seq, n))
        self._scheduled.add(id(seq))
        self.block_manager.commit(seq, seq.num_computed_tokens + n)

    def _schedule_decodes(self, priority: int, budget: int, batch: ScheduledBatch) -> int:
        """The running sequences of the class that decode: one token each."""
        decoding = [
            s for s in self.running if s.priority == priority and s.num_uncomputed_tokens == 1
        ]
        for seq in decoding:
            if budget == 0 and self.chunked_prefill:
                return 0
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted below for a sequence scheduled before it
            if self.block_manager.needs_recompute(seq):
                self._preempt(seq)  # re-admitted, it is recomputed with the long factors
                continue
            while not self.block_manager.can_append(seq):
                victim = self._victim(worse_than=None) or seq
                self._preempt(victim)
                if victim is seq:
                    break
            else:
                self.block_manager.append_slot(seq)
                self._add_to(batch, seq, 1)
                if self.chunked_prefill:  # unchunked, the budget bounds prefill tokens only
                    budget -= 1
        return budget

    def _prefilling(self, priority: int) -> list[Sequence]:
        """The running sequences of the class still prefilling, in the order admitted."""
        return [
            s
            for s in self.running
            if s.priority == priority
            and s.status is SequenceStatus.RUNNING
            and s.num_uncomputed_tokens > 1
        ]

    def _schedule_running_prefills(self, priority: int, budget: int, batch: ScheduledBatch) -> int:
        """Without chunked prefill: each prompt under way, as much as the budget holds."""
        for seq in self._prefilling(priority):
            if budget == 0:
                return 0
            n = min(seq.num_uncomputed_tokens, budget)
            self._add_to(batch, seq, n)
            budget -= n
        return budget

    def _schedule_prefills(self, priority: int, budget: int, batch: ScheduledBatch) -> int:
        """With chunked prefill: the prompts under way and the waiting ones that can start
        share what the step has left by tenant (prefill_share.py)."""
        if budget == 0:
            return 0
        share = PrefillShare(
            budget, self.long_prefill_threshold, self.max_num_partial_prefills, self.prefill_cost
        )
        under_way = [
            (seq, share.add(seq.fairness_key, seq.num_uncomputed_tokens, seq.num_computed_tokens))
            for seq in self._prefilling(priority)
        ]
        starting = self._offer_waiting(priority, share)
        for seq, claim in under_way:  # named first, so a prompt admitted now can share them
            if claim.tokens:
                self._add_to(batch, seq, claim.tokens)
                budget = max(0, budget - claim.cost)
        return self._admit_waiting([(seq, claim.tokens) for seq, claim in starting], budget, batch)

    def _offer_waiting(self, priority: int, share: PrefillShare) -> list[tuple[Sequence, Claim]]:
        """The waiting sequences, in admission order, that get tokens of the step if admitted:
        as many as the sequence slots (freed by preempting worse classes, too) allow, none
        whose adapter is still loading. Their cached prefix is as the cache holds it now
        (admission looks again)."""
        slots = self.max_num_seqs - sum(
            1 for s in self.running if not (s.priority > priority and id(s) not in self._scheduled)
        )
        starting: list[tuple[Sequence, Claim]] = []
        for seq in self._admission_order(priority):
            if len(starting) >= slots or share.budget <= share.num_tenants:
                break  # no slot, or no token left for one more tenant
            if not self._adapter_in_memory(seq):
                self._ask_for_adapter(seq)
                continue
            start = len(self.block_manager.cached_prefix(seq)) * self.block_manager.block_size
            claim = share.offer(seq.fairness_key, len(seq) - start, start)
            if claim is not None:
                starting.append((seq, claim))
        return starting

    def _adapter_in_memory(self, seq: Sequence) -> bool:
        """False while the sequence's adapter is neither in a device slot nor in host memory
        (loading): it could not be admitted, so it takes no share of the step. Whether a
        slot is free is left to admission (taking one has effects)."""
        if self.lora is None or seq.lora_request is None:
            return True
        entry = self.lora.adapters.get(seq.lora_request.adapter_id)
        return entry is not None and (entry.slot is not None or entry.host is not None)

    def _ask_for_adapter(self, seq: Sequence) -> None:
        """Ask for the adapter's load again if it was evicted from host memory since the
        request came (as an admission attempt does); nothing is taken."""
        assert self.lora is not None
        if self.lora.acquire(seq):  # only when it came in meanwhile: let the slot go again
            self.lora.unacquire(seq)

    def _admit_waiting(
        self, candidates: list[tuple[Sequence, int]], budget: int, batch: ScheduledBatch
    ) -> int:
        """Admit waiting sequences in the given order, each fed at most its given tokens;
        the first that lacks a slot or KV blocks stops the rest (it stays first in line)."""
        admitted: set[int] = set()
        for seq, most in candidates:
            if budget == 0 or not self._make_room_for(seq):
                break
            # the adapter first: taking its slot may move or forget blocks (memory_pool.py),
            # and once acquired its pages are not counted as reclaimable for this request
            if self.lora is not None and not self.lora.acquire(seq):
                continue
            cached = self.block_manager.cached_prefix(seq)
            start = len(cached) * self.block_manager.block_size
            n = len(seq) - start
            if (n > budget and not self.chunked_prefill) or not self._free_blocks_for(seq, cached):
                if self.lora is not None:
                    self.lora.unacquire(seq)
                break
            self.block_manager.allocate(seq, cached)
            self._set_status(seq, SequenceStatus.RUNNING)
            seq.admitted_order = next(self._admissions)
            self.running.append(seq)
            n = min(n, budget, most)
            self._add_to(batch, seq, n)
            admitted.add(id(seq))
            cost = self.prefill_cost.of(start, n) if self.chunked_prefill else n
            budget = max(0, budget - cost)
        if admitted:
            self.waiting = deque(s for s in self.waiting if id(s) not in admitted)
        return budget

    def _admission_order(self, priority: int) -> list[Sequence]:
        """The one place that orders waiting sequences of a class: preempted ones (they were
        running) first, then one sequence per fairness key in turn, keys in the order of
        their oldest waiting sequence, each key's sequences in arrival order. A sequence
        whose grammar is still compiling is not a candidate yet (nor holds others back)."""
        preempted: list[Sequence] = []
        by_key: dict[str | None, deque[Sequence]] = {}
        for seq in self.waiting:
            if seq.priority != priority or seq.awaiting_grammar:
                continue
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

    def _make_room_for(self, seq: Sequence) -> bool:
        """A sequence slot for a waiting sequence, preempting one of a worse class if need be."""
        while len(self.running) >= self.max_num_seqs:
            victim = self._victim(worse_than=seq.priority)
            if victim is None:
                return False
            self._preempt(victim)
        return True

    def _free_blocks_for(self, seq: Sequence, cached: list[int]) -> bool:
        """KV blocks for a waiting sequence, preempting ones of a worse class if need be."""
        while not self.block_manager.can_allocate(seq, cached):
            victim = self._victim(worse_than=seq.priority)
            if victim is None:
                return False
            self._preempt(victim)
        return True

    def _victim(self, worse_than: int | None) -> Sequence | None:
        """The running sequence to preempt: not in this step's batch, of the worst class
        (worse than `worse_than` when given), the most recently admitted of it."""
        candidates = [
            s
            for s in self.running
            if id(s) not in self._scheduled and (worse_than is None or s.priority > worse_than)
        ]
        return max(candidates, key=lambda s: (s.priority, s.admitted_order), default=None)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
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
