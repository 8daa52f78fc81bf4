"""LoRA manager: which adapters sit in device slots, which in host memory, and loading the rest.

Three tiers: device slots (`LoRASlots`, `max_loras`, LRU) <- host cache (`max_cpu_loras`,
LRU, pinned memory on CUDA) <- disk (the request's folder, or one the loader callback
stages from object storage). A pinned adapter, and any adapter a running request uses, is
never evicted from its slot.

Only the engine's step thread calls in (through the scheduler and LLMEngine). Loads run on
the loader's threads (lora_loader.py) and are taken in by `poll()` at the next step, so the
step thread never waits for a disk or the network, and one load serves every request for
an adapter (single flight). A lock guards the state so `list_loras()` and `stats()` may be
read from other threads.

No starvation: when an adapter in host memory finds every slot busy, it becomes the
`reserved` adapter: no other adapter may take a slot before it, and the busy slot that will
free soonest is `draining` (its adapter takes no new requests until the reserved one is in).
"""

import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from .errors import AdapterLoadError, InvalidRequestError
from .lora import HostAdapter, LoRARequest, LoRASlots, timed_write
from .lora_loader import AdapterLoader
from .metrics import EngineMetrics
from .peft_rules import ArchFingerprint
from .sequence import Sequence, SequenceStatus


@dataclass(eq=False)
class Adapter:
    """What the manager knows about one adapter id."""

    request: LoRARequest
    host: HostAdapter | None = None
    slot: int | None = None
    pinned: bool = False
    load: object | None = None  # token of the load in flight; None when not loading
    queued: bool = False  # waits for host room before its load starts
    num_waiting: int = 0  # waiting requests
    running: set = field(default_factory=set)  # running Sequences
    futures: list[Future] = field(default_factory=list)  # load_lora() callers

    @property
    def name(self) -> str:
        return self.request.name

    @property
    def tier(self) -> str:
        return "device" if self.slot is not None else "host" if self.host is not None else "disk"


class LoRAManager:
    def __init__(
        self,
        slots: LoRASlots,
        fingerprint: ArchFingerprint,
        *,
        max_cpu_loras: int,
        metrics: EngineMetrics,
        loader: Callable[[LoRARequest], str | os.PathLike] | None = None,
    ):
        self.slots = slots
        self.max_cpu_loras = max_cpu_loras
        self.metrics = metrics
        self.adapters: dict[str, Adapter] = {}
        self.slot_owner: list[str | None] = [None] * slots.num_slots
        self.slot_lru: OrderedDict[str, None] = OrderedDict()  # in slots, least recent first
        self.host_lru: OrderedDict[str, None] = OrderedDict()  # in host memory, same order
        self.load_queue: OrderedDict[str, None] = OrderedDict()  # loads waiting for host room
        self.reserved: str | None = None  # adapter the next free slot goes to
        self.draining: str | None = None  # adapter whose slot is being freed for it
        self.lock = threading.RLock()
        self.loader = AdapterLoader(slots, fingerprint, loader)
        self._swap_events: list = []  # CUDA (start, end) events of swap-ins not yet timed

    # -- requests (step thread) -------------------------------------------------------------

    def add_request(self, seq: Sequence):
        """A new waiting request: count the lookup, and start loading a cold adapter."""
        req = seq.lora_request
        if req is None:
            return
        m = self.metrics
        with self.lock:
            entry = self.adapters.get(req.adapter_id)
            if entry is None:
                entry = self.adapters[req.adapter_id] = Adapter(req)
            elif entry.host is None and entry.slot is None:
                entry.request = req  # the newest path or name serves the next load
            entry.num_waiting += 1
            m.lora_lookups["device"] += 1
            if entry.slot is not None:
                m.lora_hits["device"] += 1
                self.slot_lru.move_to_end(req.adapter_id)
                return
            m.lora_lookups["host"] += 1
            if entry.host is not None:
                m.lora_hits["host"] += 1
                self.host_lru.move_to_end(req.adapter_id)
                return
            self._want_load(entry)

    def status_changed(self, seq: Sequence, old: SequenceStatus, new: SequenceStatus):
        """Keep each adapter's waiting count and running set; the scheduler calls this on
        every status change of a request."""
        req = seq.lora_request
        if req is None:
            return
        with self.lock:
            entry = self.adapters.get(req.adapter_id)
            if entry is None:  # its load failed and the engine is failing its requests
                return
            if old is SequenceStatus.WAITING:
                entry.num_waiting -= 1
            elif old is SequenceStatus.RUNNING:
                entry.running.discard(seq)
                seq.lora_slot = -1
            if new is SequenceStatus.WAITING:
                entry.num_waiting += 1
            elif new is SequenceStatus.RUNNING:
                entry.running.add(seq)

    def begin_schedule(self):
        """Before admitting anyone: the reserved adapter takes a slot if one is free now."""
        with self.lock:
            entry = self.adapters.get(self.reserved) if self.reserved is not None else None
            if entry is None or entry.num_waiting == 0 or entry.slot is not None:
                self.reserved = self.draining = None
                return
            if entry.host is None:
                self._want_load(entry)
                return
            slot = self._free_slot()
            if slot is None:
                self._choose_draining()
                return
            self._swap_in(entry, slot)
            self.reserved = self.draining = None

    def acquire(self, seq: Sequence) -> bool:
        """Give a request about to be admitted its adapter's device slot, swapping the adapter
        in now (between steps) if it is in host memory and a slot can be had. False: the
        request must wait (adapter loading, or no slot for it this step)."""
        req = seq.lora_request
        if req is None:
            seq.lora_slot = -1
            return True
        with self.lock:
            entry = self.adapters[req.adapter_id]
            if entry.slot is not None:
                if req.adapter_id == self.draining:
                    return False
                self.slot_lru.move_to_end(req.adapter_id)
                seq.lora_slot = entry.slot
                return True
            if entry.host is None:
                self._want_load(entry)  # evicted from host since it was looked up
                return False
            if self.reserved not in (None, req.adapter_id):
                return False  # the next free slot is promised to an older adapter
            slot = self._free_slot()
            if slot is None:
                self.reserved = req.adapter_id
                self._choose_draining()
                return False
            self._swap_in(entry, slot)
            if self.reserved == req.adapter_id:
                self.reserved = self.draining = None
            seq.lora_slot = slot
            return True

    # -- slots ----------------------------------------------------------------------------------

    def _free_slot(self) -> int | None:
        """An empty slot, or the slot of the least recently used adapter that no running
        request uses and nobody pinned (preferring one no waiting request needs either)."""
        for slot, owner in enumerate(self.slot_owner):
            if owner is None:
                return slot
        idle = [
            a
            for a in map(self.adapters.__getitem__, self.slot_lru)
            if not a.pinned and not a.running
        ]
        if not idle:
            return None
        victim = next((a for a in idle if a.num_waiting == 0), idle[0])
        slot = victim.slot
        self._evict_slot(victim)
        self.metrics.lora_evictions["device"] += 1
        return slot

    def _evict_slot(self, entry: Adapter):
        self.slots.clear(entry.slot)
        self.slot_owner[entry.slot] = None
        entry.slot = None
        del self.slot_lru[entry.request.adapter_id]
        if self.draining == entry.request.adapter_id:
            self.draining = None

    def _swap_in(self, entry: Adapter, slot: int):
        adapter_id = entry.request.adapter_id
        timing = timed_write(self.slots, slot, entry.host)
        if isinstance(timing, float):
            self.metrics.lora_swap_in.observe(timing)
        else:
            self._swap_events.append(timing)
        entry.slot = slot
        self.slot_owner[slot] = adapter_id
        self.slot_lru[adapter_id] = None
        if adapter_id in self.host_lru:
            self.host_lru.move_to_end(adapter_id)

    def _choose_draining(self):
        """The busy, unpinned slot that frees soonest: its running requests have the fewest
        tokens left to make. It is kept until the reserved adapter is in."""
        current = self.adapters.get(self.draining) if self.draining is not None else None
        if current is not None and current.slot is not None and not current.pinned:
            return
        busy = [a for a in map(self.adapters.__getitem__, self.slot_lru) if not a.pinned]
        if busy:
            victim = min(busy, key=_tokens_left)
            self.draining = victim.request.adapter_id

    # -- loading --------------------------------------------------------------------------------

    def _want_load(self, entry: Adapter):
        if entry.load is None and not entry.queued:
            entry.queued = True
            self.load_queue[entry.request.adapter_id] = None
            self._start_loads()

    def _start_loads(self):
        """Start queued loads, oldest first, while host memory has room for their results
        next to the adapters that requests are waiting to swap in."""
        loading = sum(1 for a in self.adapters.values() if a.load is not None)
        needed = sum(1 for i in self.host_lru if self._needs_host(self.adapters[i]))
        while self.load_queue and needed + loading < self.max_cpu_loras:
            adapter_id, _ = self.load_queue.popitem(last=False)
            entry = self.adapters.get(adapter_id)
            if entry is None or not entry.queued:
                continue
            entry.queued = False
            if not (entry.num_waiting or entry.futures or entry.pinned):
                continue  # everyone who wanted it has gone
            entry.load = token = object()
            self.metrics.lora_loads += 1
            self.metrics.lora_lookups["disk"] += 1
            self.loader.submit(entry.request, token)
            loading += 1

    def _needs_host(self, entry: Adapter) -> bool:
        """Whether the host copy is needed: not in a slot yet, but wanted there."""
        return entry.slot is None and (entry.num_waiting > 0 or entry.pinned)

    def poll(self) -> list[tuple[str, AdapterLoadError]]:
        """At a step boundary: take in finished loads, start queued ones, bring pinned
        adapters into free slots. Returns (adapter id, error) of loads that failed; the
        engine fails the requests waiting for those."""
        failed = []
        with self.lock:
            for result in self.loader.finished():
                entry = self.adapters.get(result.adapter_id)
                if entry is None or entry.load is not result.token:
                    continue  # unloaded while it was loading
                entry.load = None
                self.metrics.lora_load.observe(result.seconds)
                if result.error is not None:
                    self.metrics.lora_load_failures += 1
                    failed.append((result.adapter_id, result.error))
                    for future in entry.futures:
                        future.set_exception(result.error)
                    entry.futures.clear()
                    if entry.host is None and entry.slot is None:
                        del self.adapters[result.adapter_id]
                        entry.pinned = False
                    continue
                self.metrics.lora_hits[result.tier] += 1
                entry.host = result.adapter
                self.host_lru[result.adapter_id] = None
                self._shrink_host()
                for future in entry.futures:
                    future.set_result(None)
                entry.futures.clear()
            self._time_swaps()
            self._start_loads()
            self._place_pinned()
        return failed

    def _place_pinned(self):
        """Pinned adapters in host memory take a free (or idle) slot."""
        for entry in list(self.adapters.values()):
            if entry.pinned and entry.slot is None and entry.host is not None:
                if (slot := self._free_slot()) is None:
                    return
                self._swap_in(entry, slot)

    def _shrink_host(self):
        """Evict least recently used host copies that nobody waits to swap in."""
        for adapter_id in list(self.host_lru):
            if len(self.host_lru) <= self.max_cpu_loras:
                return
            entry = self.adapters[adapter_id]
            if not self._needs_host(entry):
                entry.host = None
                del self.host_lru[adapter_id]
                self.metrics.lora_evictions["host"] += 1

    def _time_swaps(self):
        pending = []
        for start, end in self._swap_events:
            if end.query():
                self.metrics.lora_swap_in.observe(start.elapsed_time(end) / 1000)
            else:
                pending.append((start, end))
        self._swap_events = pending

    def busy(self) -> bool:
        """Loads in flight or queued: the engine has work even with no request."""
        with self.lock:
            return any(a.load is not None or a.queued for a in self.adapters.values())

    def wait_for_load(self, timeout: float) -> bool:
        """Block until a load finishes (for callers that step the engine themselves)."""
        return self.loader.wait(timeout)

    # -- control (the engine's owner thread) ---------------------------------------------------

    def load(self, req: LoRARequest, pin: bool = False) -> Future:
        """Bring an adapter into host memory ahead of its requests, and with `pin` keep it
        in a slot; the future resolves when it is in memory (or raises AdapterLoadError)."""
        future: Future = Future()
        with self.lock:
            entry = self.adapters.get(req.adapter_id)
            if pin and not (entry is not None and entry.pinned):
                self._check_pin_room(req.name)
            if entry is None:
                entry = self.adapters[req.adapter_id] = Adapter(req)
            if pin:
                self.pin(req.adapter_id)
            if entry.host is not None or entry.slot is not None:
                future.set_result(None)
                return future
            entry.futures.append(future)
            self._want_load(entry)
        return future

    def unload(self, adapter_id: str) -> bool:
        """Forget an adapter: free its slot and host copy. Refused while requests use it."""
        with self.lock:
            entry = self.adapters.get(adapter_id)
            if entry is None:
                return False
            in_use = entry.num_waiting + len(entry.running)
            if in_use:
                raise InvalidRequestError(
                    f"adapter {entry.name!r} ({adapter_id}) is in use by {in_use} request(s); "
                    f"abort them or unload it after they finish"
                )
            if entry.slot is not None:
                self._evict_slot(entry)
            self.host_lru.pop(adapter_id, None)
            self.load_queue.pop(adapter_id, None)
            for future in entry.futures:
                future.cancel()
            if self.reserved == adapter_id:
                self.reserved = self.draining = None
            del self.adapters[adapter_id]
            return True

    def pin(self, adapter_id: str, pinned: bool = True):
        """Keep an adapter in a device slot until unpinned (it is swapped in now if a slot is
        free or idle, else as soon as one is). At most max_loras - 1 adapters may be pinned,
        so one slot always serves the others."""
        with self.lock:
            entry = self.adapters.get(adapter_id)
            if entry is None:
                raise InvalidRequestError(
                    f"adapter {adapter_id!r} is not known to the engine; load it first"
                )
            if pinned and not entry.pinned:
                self._check_pin_room(entry.name)
                if entry.host is None and entry.slot is None:
                    self._want_load(entry)
            entry.pinned = pinned
            self._place_pinned()  # callers run between steps, so a swap-in is safe now

    def _check_pin_room(self, name: str):
        count = sum(a.pinned for a in self.adapters.values())
        if count + 1 >= self.slots.num_slots:
            raise InvalidRequestError(
                f"cannot pin adapter {name!r}: {count} adapter(s) are pinned and max_loras is "
                f"{self.slots.num_slots}; one slot must stay free for the other adapters"
            )

    def list_loras(self) -> list[dict]:
        with self.lock:
            return [
                {
                    "name": a.name,
                    "adapter_id": adapter_id,
                    "path": a.host.path if a.host else _fspath(a.request.path),
                    "tier": a.tier,
                    "slot": a.slot,
                    "pinned": a.pinned,
                    "loading": a.load is not None or a.queued,
                    "rank": a.host.spec.rank if a.host else None,
                    "running": len(a.running),
                    "waiting": a.num_waiting,
                }
                for adapter_id, a in self.adapters.items()
            ]

    def stats(self) -> dict:
        with self.lock:
            running = sorted({a.name for a in self.adapters.values() if a.running})
            waiting = sorted({a.name for a in self.adapters.values() if a.num_waiting})
            return {
                **self.metrics.lora_counters(),
                "slots_used": sum(o is not None for o in self.slot_owner),
                "slots_total": self.slots.num_slots,
                "adapters_waiting": len(waiting),
                "running_adapters": running,
                "waiting_adapter_names": waiting,
            }

    def shutdown(self):
        self.loader.shutdown()


def _fspath(path) -> str | None:
    return os.fspath(path) if path is not None else None


def _tokens_left(entry: Adapter) -> int:
    return max(
        (s.params.max_tokens - s.num_completion_tokens for s in entry.running),
        default=0,
    )
