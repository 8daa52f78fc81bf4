"""Where each decoding sequence's keys and values are kept between steps on the CPU.

Decode attention on the CPU reads the batch's keys and values as padded rectangles, one row
per sequence (model/decode_kv.py): gathering them from the paged cache every step costs as
much as the attention itself. So each sequence gets a slot in a buffer when
it starts decoding, its cached tokens are copied there once, and each step adds its new
token. A sequence that joins costs its own tokens; one that leaves frees its slot; nobody
else's keys move. A buffer's slots attend as one batched call, so sequences of similar
lengths share a buffer, and a new buffer has as many slots as there are sequences of its
length joining with it or held already (a power of two, at most `max_slots`): slots double
as the batch grows without a buffer ever being resized for more of them, and a batch that
arrives at once is seated without spare slots. A buffer's capacity grows (its few sequences
copied) when its longest outgrows it, by half at least, so that copy is rare. Buffers that
would outgrow the budget are repacked once (every sequence copied in again) before none are
kept.

This is the host's bookkeeping only: it plans, every layer applies the plan.
"""

import itertools
from dataclasses import dataclass

from .model.context import DecodeBufferPlan, DecodeGroup
from .sequence import Sequence, SequenceStatus


@dataclass
class Seat:
    """A sequence's slot, and how much of it is filled."""

    seq: Sequence
    buffer: int
    slot: int
    preemptions: int  # the sequence's count when seated: a recompute since empties the slot
    held: int  # tokens whose keys and values the slot holds


@dataclass
class Buffer:
    capacity: int  # tokens per slot
    seats: list[Seat | None]

    def longest(self) -> int:
        return max((len(seat.seq) for seat in self.seats if seat is not None), default=0)


class DecodeBufferPlanner:
    def __init__(
        self,
        block_size: int,
        token_bytes: int,
        budget_bytes: int,
        max_slots: int = 8,
        headroom: int = 64,
    ):
        self.block_size = block_size
        self.token_bytes = token_bytes  # one token's keys and values, every layer
        self.budget_bytes = budget_bytes  # at most this much kept; beyond, gather every step
        self.max_slots = max_slots
        self.headroom = headroom  # tokens a new or grown buffer has to spare
        self.buffers: dict[int, Buffer] = {}
        self.seats: dict[int, Seat] = {}  # by id(seq); a seat holds its sequence alive
        self._ids = itertools.count()

    @property
    def nbytes(self) -> int:
        return sum(len(b.seats) * b.capacity for b in self.buffers.values()) * self.token_bytes

    def plan(
        self, decodes: list[Sequence]
    ) -> tuple[list[Sequence], list[DecodeGroup], DecodeBufferPlan] | None:
        """The decode batch in the order its rows attend, its groups, and the plan of the
        buffers; None when the buffers would outgrow the budget (none are kept then)."""
        if not self.budget_bytes:
            return None
        fed = {id(seq) for seq in decodes}
        self._release(fed)
        self._seat([seq for seq in decodes if id(seq) not in self.seats])
        for seq in decodes:
            self._fit(self.seats[id(seq)], len(seq))
        if self.nbytes > self.budget_bytes:  # seated over time, slots left spare: repack
            self.buffers, self.seats = {}, {}
            self._seat(decodes)
            for seq in decodes:
                self._fit(self.seats[id(seq)], len(seq))
        if self.nbytes > self.budget_bytes:
            self.buffers, self.seats = {}, {}
            return None
        seats = sorted((self.seats[id(seq)] for seq in decodes), key=lambda s: (s.buffer, s.slot))
        plan = self._shapes()
        groups: list[DecodeGroup] = []
        for row, seat in enumerate(seats):
            n = len(seat.seq)
            if seat.held != n - 1:  # a new slot, or one that no longer matches the cache
                plan.fills.append((row, seat.buffer, seat.slot, n - 1))
            seat.held = n
            if groups and _next_slot(groups[-1]) == (seat.buffer, seat.slot):
                groups[-1].end, groups[-1].width = row + 1, max(groups[-1].width, n)
            else:  # another buffer, or a slot held by a sequence not in this step
                groups.append(DecodeGroup(row, row + 1, seat.buffer, seat.slot, n))
        return [seat.seq for seat in seats], groups, plan

    def release(self) -> DecodeBufferPlan:
        """A step without decodes: the buffers of the sequences still running stay."""
        self._release(set())
        return self._shapes()

    def _shapes(self) -> DecodeBufferPlan:
        return DecodeBufferPlan({i: (len(b.seats), b.capacity) for i, b in self.buffers.items()})

    def _release(self, fed: set[int]) -> None:
        """Empty the slots of sequences that finished, were preempted or recomputed; drop
        buffers left empty. A running sequence absent from a step keeps its slot."""
        for key, seat in list(self.seats.items()):
            seq = seat.seq
            gone = key not in fed and seq.status is not SequenceStatus.RUNNING
            if gone or seq.num_preemptions != seat.preemptions:
                del self.seats[key]
                self.buffers[seat.buffer].seats[seat.slot] = None
        for i, buffer in list(self.buffers.items()):
            if not any(buffer.seats):
                del self.buffers[i]

    def _seat(self, joining: list[Sequence]) -> None:
        """Slots for the sequences that join, longest first, each in a buffer of similar
        lengths with room for it, else in a new one."""
        joining = sorted(joining, key=len, reverse=True)
        for k, seq in enumerate(joining):
            n = len(seq)
            fits = [
                (b.capacity, i)
                for i, b in self.buffers.items()
                if None in b.seats and b.capacity >= n and _similar(b.longest(), n)
            ]
            if fits:
                _, i = min(fits)
            else:
                i = next(self._ids)
                alike = [other for other in joining[k:] if _similar(n, len(other))]
                held = [s for s in self.seats.values() if _similar(n, len(s.seq))]
                want = max(len(alike), len(held), 1)
                slots = min(self.max_slots, 1 << (want - 1).bit_length())
                self.buffers[i] = Buffer(self._round(n + self.headroom), [None] * slots)
            buffer = self.buffers[i]
            slot = buffer.seats.index(None)
            seat = Seat(seq, i, slot, seq.num_preemptions, held=0)
            buffer.seats[slot] = self.seats[id(seq)] = seat

    def _fit(self, seat: Seat, n: int) -> None:
        """Grow the seat's buffer if the sequence's `n` tokens outgrow it."""
        buffer = self.buffers[seat.buffer]
        if n > buffer.capacity:
            grown = max(n + self.headroom, buffer.capacity * 3 // 2)
            buffer.capacity = self._round(grown)

    def _round(self, tokens: int) -> int:
        return -(-tokens // self.block_size) * self.block_size


def _next_slot(group: DecodeGroup) -> tuple[int, int]:
    """(buffer, slot) of the row that would extend the group."""
    return group.buffer, group.slot + group.end - group.start


def _similar(longest: int, n: int) -> bool:
    """Whether a sequence of n tokens attends with ones of up to `longest` (0: none yet)
    without much padding: within 3/4 of each other."""
    return longest == 0 or (4 * n >= 3 * longest and 4 * longest >= 3 * n)
