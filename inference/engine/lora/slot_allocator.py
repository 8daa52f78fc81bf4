"""Which adapter sits in which device slot.

Least recently used first out, but never an adapter that is pinned or that a running
request uses. No starvation: when an adapter in host memory finds every slot busy, it
becomes the `reserved` adapter: no other adapter may take a slot before it, and the busy
slot that will free soonest is `draining` (its adapter takes no new requests until the
reserved one is in).
"""

from collections import OrderedDict

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

    def free_slot(self) -> int | None:
        """An empty slot, or the slot of the least recently used adapter that no running
        request uses and nobody pinned (preferring one no waiting request needs either)."""
        for slot, owner in enumerate(self.owner):
            if owner is None:
                return slot
        idle = [
            a for a in map(self.adapters.__getitem__, self.lru) if not a.pinned and not a.running
        ]
        if not idle:
            return None
        victim = next((a for a in idle if a.num_waiting == 0), idle[0])
        freed = victim.slot
        self.evict(victim)
        self.metrics.lora_evictions["device"] += 1
        return freed

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

    def choose_draining(self) -> None:
        """The busy, unpinned slot that frees soonest: its running requests have the fewest
        tokens left to make. It is kept until the reserved adapter is in."""
        current = self.adapters.get(self.draining) if self.draining is not None else None
        if current is not None and current.slot is not None and not current.pinned:
            return
        busy = [a for a in map(self.adapters.__getitem__, self.lru) if not a.pinned]
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
