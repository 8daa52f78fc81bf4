"""Which adapter sits in which device slot.

Least recently used first out, but never an adapter that is pinned or that a running
request uses. No starvation: when an adapter in host memory finds every slot busy, it
becomes the `reserved` adapter: no other adapter may take a slot before it, and the busy
slot that will free soonest is `draining` (its adapter takes no new requests until the
reserved one is in).

An adapter with extras (DoRA scales, head LoRA, saved heads) needs room in the slots' arena
too: idle adapters holding extras are evicted to make it, and when the busy ones hold it,
the one to drain is chosen among them.
"""

from collections import OrderedDict
from collections.abc import Callable

import torch

from ..metrics import EngineMetrics
from .entry import AdapterEntry
from .slots import LoRASlots, timed_write


class SlotAllocator:
    def __init__(self, slots: LoRASlots, adapters: dict[str, AdapterEntry], metrics: EngineMetrics):
        self.slots = slots
        self.adapters = adapters  # the manager's table, shared
        self.metrics = metrics
        self.owner: list[str | None] = [None] * slots.num_slots
        self.lru: OrderedDict[str, None] = OrderedDict()  # adapters in slots, least recent first
        self.reserved: str | None = None  # adapter the next free slot goes to
        self.draining: str | None = None  # adapter whose slot is being freed for it
        # CUDA (start, end) events of swap-ins not yet timed
        self._swap_events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    @property
    def num_used(self) -> int:
        return sum(o is not None for o in self.owner)

    def touch(self, adapter_id: str) -> None:
        self.lru.move_to_end(adapter_id)

    def release_reservation(self) -> None:
        self.reserved = self.draining = None

    def free_slot(self, entry: AdapterEntry) -> int | None:
        """A slot for `entry`, with arena room for its extras: an empty slot, or the slot of
        the least recently used adapter that no running request uses and nobody pinned
        (preferring one no waiting request needs either); None if there is none now."""
        slot = next((s for s, owner in enumerate(self.owner) if owner is None), None)
        if slot is None:
            victim = self._idle_victim(lambda a: True)
            if victim is None:
                return None
            slot = victim.slot
            self._evict_idle(victim)
        while entry.host is not None and not self.slots.fits_extras(entry.host):
            victim = self._idle_victim(
                lambda a: a.slot is not None and self.slots.holds_extras(a.slot)
            )
            if victim is None:
                return None  # busy adapters hold the arena: wait for one to drain
            self._evict_idle(victim)
        return slot

    def pinned_out(self, entry: AdapterEntry) -> bool:
        """Whether pinned adapters hold so much of the arena that `entry`'s extras cannot fit
        until one is unpinned: reserving the next slot for it would then stall the others."""
        if entry.host is None or entry.host.extras is None:
            return False
        pinned = sum(
            self.slots.extras_numel(a.slot)
            for a in self.adapters.values()
            if a.pinned and a.slot is not None
        )
        return self.slots.arena.capacity - pinned < entry.host.extras_numel

    def _idle_victim(self, eligible: Callable[[AdapterEntry], bool]) -> AdapterEntry | None:
        idle = [
            a
            for a in map(self.adapters.__getitem__, self.lru)
            if not a.pinned and not a.running and eligible(a)
        ]
        return next((a for a in idle if a.num_waiting == 0), idle[0] if idle else None)

    def _evict_idle(self, victim: AdapterEntry) -> None:
        self.evict(victim)
        self.metrics.lora_evictions["device"] += 1

    def evict(self, entry: AdapterEntry) -> None:
        assert entry.slot is not None
        self.slots.clear(entry.slot)
        self.owner[entry.slot] = None
        entry.slot = None
        del self.lru[entry.adapter_id]
        if self.draining == entry.adapter_id:
            self.draining = None

    def swap_in(self, entry: AdapterEntry, slot: int) -> None:
        assert entry.host is not None
        timing = timed_write(self.slots, slot, entry.host)
        if isinstance(timing, float):
            self.metrics.lora_swap_in.observe(timing)
        else:
            self._swap_events.append(timing)
        entry.slot = slot
        self.owner[slot] = entry.adapter_id
        self.lru[entry.adapter_id] = None

    def forget(self, entry: AdapterEntry) -> None:
        """An adapter is unloaded: free its slot and any reservation it held."""
        if entry.slot is not None:
            self.evict(entry)
        if self.reserved == entry.adapter_id:
            self.release_reservation()

    def choose_draining(self, entry: AdapterEntry) -> None:
        """The busy, unpinned slot that frees soonest: its running requests have the fewest
        tokens left to make; among the adapters holding extras when `entry` waits for arena
        room. It is kept until the reserved adapter is in."""
        current = self.adapters.get(self.draining) if self.draining is not None else None
        if current is not None and current.slot is not None and not current.pinned:
            return
        busy = [a for a in map(self.adapters.__getitem__, self.lru) if not a.pinned]
        if entry.host is not None and not self.slots.fits_extras(entry.host):
            busy = [a for a in busy if a.slot is not None and self.slots.holds_extras(a.slot)]
        if busy:
            self.draining = min(busy, key=lambda a: a.tokens_left).adapter_id

    def time_swaps(self) -> None:
        """Observe the swap-ins whose CUDA events have completed."""
        pending = []
        for start, end in self._swap_events:
            if end.query():
                self.metrics.lora_swap_in.observe(start.elapsed_time(end) / 1000)
            else:
                pending.append((start, end))
        self._swap_events = pending
