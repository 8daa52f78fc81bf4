"""Which adapter sits in which device slot, and the slot groups' pages it borrows from the
KV cache's pool (memory_pool.py).

A slot with no adapter lends its pages to the KV side. An adapter coming in takes, in
order: an empty slot whose pages hold no block a request holds (free pages cost nothing;
cached prefixes nobody holds are forgotten), the lowest first; else an empty slot whose held
blocks can move to free pages outside it (one page copy each; the sequences' tables
follow), the fewest first; else the slot of the idle adapter least worth keeping
(`keep_score`). Never an adapter that is pinned or that a running request uses. No
starvation: when an adapter in host memory finds every slot busy, it becomes the `reserved`
adapter: no other adapter may take a slot before it, and the busy slot that will free soonest
is `draining` (its adapter takes no new requests until the reserved one is in).

When the KV side runs out of blocks, idle adapters give their pages back, the one least
worth keeping first (`reclaim_pages`).

An adapter with extras (DoRA scales, head LoRA, saved heads) needs room in the slots' arena
too: idle adapters holding extras are evicted to make it, and when the busy ones hold it,
the one to drain is chosen among them.
"""

from collections import OrderedDict
from collections.abc import Callable

import torch

from ..block_manager import BlockManager
from ..memory_pool import PoolLayout
from ..metrics import EngineMetrics
from .entry import AdapterEntry
from .slots import LoRASlots, timed_write

# What bringing an adapter back costs, by where its copy is (relative): a host copy is one
# host-to-device copy, a disk load reads and packs the files, the object store adds a
# download on top. An idle adapter's keep score is this times its recency rank.
RELOAD_COST = {"host": 1.0, "disk": 4.0, "loader": 16.0}
MovePages = Callable[[list[tuple[int, int]]], None]


class SlotAllocator:
    def __init__(self, slots: LoRASlots, adapters: dict[str, AdapterEntry], metrics: EngineMetrics):
        self.slots = slots
        self.adapters = adapters  # the manager's table, shared
        self.metrics = metrics
        # the pool the slot groups are part of (None: slots of their own, as in unit use)
        self.pool: BlockManager | None = None
        self.layout: PoolLayout | None = None
        self.move_pages: MovePages | None = None
        self.admitting: str | None = None  # an adapter acquired for a request not yet running
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

    def attach_pool(self, pool: BlockManager, layout: PoolLayout, move_pages: MovePages) -> None:
        """Serve the slots from the pool's slot groups (model_runner.py bound the rows)."""
        assert layout.num_slots == self.slots.num_slots
        self.pool, self.layout, self.move_pages = pool, layout, move_pages

    def free_slot(self, entry: AdapterEntry) -> int | None:
        """A slot for `entry`, with arena room for its extras (see the module's docstring for
        the order slots are chosen in); None if there is none now."""
        slot = self._empty_slot()
        if slot is None:
            victim = self._idle_victim(lambda a: True)
            if victim is None:
                return None
            slot = victim.slot
            assert slot is not None  # idle adapters are those in slots
            self._evict_idle(victim, give_back=False)
        else:
            self._borrow(slot)
        while entry.host is not None and not self.slots.fits_extras(entry.host):
            victim = self._idle_victim(
                lambda a: a.slot is not None and self.slots.holds_extras(a.slot)
            )
            if victim is None:  # busy adapters hold the arena: wait for one to drain
                self._give_back(slot)  # the slot stays empty: its pages serve KV
                return None
            self._evict_idle(victim)
        return slot

    def _empty_slot(self) -> int | None:
        """The empty slot cheapest to fill: none of its pages held by a request, else the
        fewest held blocks that fit outside it; None when no empty slot can be had."""
        empty = [s for s, owner in enumerate(self.owner) if owner is None]
        if self.pool is None or self.layout is None:
            return empty[0] if empty else None
        pool, layout = self.pool, self.layout
        costs = [(pool.held_in(layout.slot_pages(s)), s) for s in empty]
        movable = [(held, s) for held, s in costs if pool.can_lend(layout.slot_pages(s))]
        return min(movable)[1] if movable else None

    def _borrow(self, slot: int) -> None:
        """Take the slot group's pages from the KV side, moving its held blocks out first."""
        if self.pool is None or self.layout is None or slot in self.pool.lent:
            return
        pages = self.layout.slot_pages(slot)
        cached = self.pool.cached_in(pages)
        moves = self.pool.lend(slot, pages)
        if moves:
            assert self.move_pages is not None
            self.move_pages(moves)
            self.metrics.pool_blocks_moved += len(moves)
        self.metrics.pool_evictions["prefix_for_adapter"] += cached
        self.metrics.pool_resizes["kv_to_adapter"] += len(pages)

    def _give_back(self, slot: int) -> None:
        if self.pool is not None and slot in self.pool.lent:
            self.metrics.pool_resizes["adapter_to_kv"] += len(self.pool.lent[slot])
            self.pool.give_back(slot)

    def reclaimable_pages(self) -> int:
        """Pages the idle adapters' slots would give the KV side (none when the slots are
        reserved)."""
        if self.pool is None or self.layout is None or self.pool.slots_reserved:
            return 0
        k = self.layout.pages_per_slot
        return k * sum(1 for a in map(self.adapters.__getitem__, self.lru) if self._idle(a))

    def reclaim_pages(self) -> bool:
        """Evict the idle adapter least worth keeping, so its pages serve KV blocks."""
        if self.pool is None or self.pool.slots_reserved:
            return False
        victim = self._idle_victim(lambda a: True)
        if victim is None:
            return False
        self._evict_idle(victim, reason="adapter_for_kv")
        return True

    def pages_in_use(self) -> int:
        """Pages of the slots whose adapter is in use (running, being admitted, pinned)."""
        if self.layout is None:
            return 0
        in_use = sum(1 for a in map(self.adapters.__getitem__, self.lru) if not self._idle(a))
        return self.layout.pages_per_slot * in_use

    def _idle(self, entry: AdapterEntry) -> bool:
        """Evictable: no running request uses it, none is being admitted with it, unpinned."""
        return not entry.pinned and not entry.running and entry.adapter_id != self.admitting

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
        """The idle adapter least worth keeping: one no waiting request needs before one
        that some do, then the lowest `keep_score`."""
        idle = [
            (a.num_waiting > 0, keep_score(a, rank), a)
            for rank, a in enumerate(map(self.adapters.__getitem__, self.lru))
            if self._idle(a) and eligible(a)
        ]
        return min(idle, key=lambda t: t[:2])[2] if idle else None

    def _evict_idle(
        self, victim: AdapterEntry, give_back: bool = True, reason: str = "adapter_for_adapter"
    ) -> None:
        self.evict(victim, give_back)
        self.metrics.lora_evictions["device"] += 1
        self.metrics.pool_evictions[reason] += 1

    def evict(self, entry: AdapterEntry, give_back: bool = True) -> None:
        """Take an adapter out of its slot; with `give_back` the slot's pages go back to the
        KV side (else the next adapter in the slot keeps them)."""
        assert entry.slot is not None
        self.slots.clear(entry.slot)
        if give_back:
            self._give_back(entry.slot)
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


def keep_score(entry: AdapterEntry, recency: int) -> float:
    """How much an idle adapter is worth keeping in its slot: what reloading it costs
    (RELOAD_COST by where its copy is) times its recency rank (0: the least recently used
    adapter in a slot, so the most recent ones have the highest rank)."""
    return RELOAD_COST.get(entry.reload_tier, RELOAD_COST["disk"]) * (1 + recency)
