"""LoRA manager: which adapters sit in device slots, which in host memory, and loading the rest.

Three tiers: device slots (`SlotAllocator`, in the KV cache's pool) <- host memory (`HostCache`,
`max_cpu_loras`, LRU, pinned memory on CUDA) <- disk (the request's folder, or one the
loader callback stages from object storage). A pinned adapter, and any adapter a running
request uses, is never evicted from its slot.

The manager keeps one AdapterEntry per adapter id, counts each adapter's waiting and running
requests, and answers the scheduler and the engine's LoRA controls. Only the engine's step
thread calls in (through the scheduler and LLMEngine); a lock guards the state so
`list_loras()` and `stats()` may be read from other threads.
"""

import os
import threading
from collections.abc import Iterable
from concurrent.futures import Future
from typing import Any

from ..block_manager import BlockManager
from ..errors import AdapterLoadError, InvalidRequestError
from ..memory_pool import PoolLayout
from ..metrics import EngineMetrics
from ..request import LoRARequest
from ..sequence import Sequence, SequenceStatus
from .entry import AdapterEntry
from .host_cache import HostCache
from .loader import AdapterLoader
from .slot_allocator import MovePages, SlotAllocator


class LoRAManager:
    def __init__(self, loader: AdapterLoader, *, max_cpu_loras: int, metrics: EngineMetrics):
        self.metrics = metrics
        self.adapters: dict[str, AdapterEntry] = {}
        self.lock = threading.RLock()
        self.loader = loader
        self.allocator = SlotAllocator(loader.slots, self.adapters, metrics)
        slots = loader.slots
        # host memory holds as many extras per adapter, on average, as the device arena
        host_bytes = max_cpu_loras * slots.row_nbytes + (
            -(-max_cpu_loras // slots.num_slots) * slots.arena.nbytes
        )
        self.host_cache = HostCache(self.adapters, max_cpu_loras, metrics, loader, host_bytes)

    def attach_pool(self, pool: BlockManager, layout: PoolLayout, move_pages: MovePages) -> None:
        """Borrow the slot groups' pages from the block manager, and lend it the pages of idle
        adapters when it runs short."""
        self.allocator.attach_pool(pool, layout, move_pages)
        pool.lender = self

    def reclaimable_pages(self) -> int:
        with self.lock:
            return self.allocator.reclaimable_pages()

    def reclaim_pages(self) -> bool:
        with self.lock:
            return self.allocator.reclaim_pages()

    def pool_pages(self) -> dict[str, int]:
        """Pages lent to adapter slots: those whose adapter is in use (a request runs on it,
        or it is pinned or being admitted) and the rest: idle adapters' (and, when the slots
        are reserved, empty slots')."""
        with self.lock:
            allocator = self.allocator
            if allocator.pool is None or allocator.layout is None:
                return {"adapters_in_use": 0, "adapters_idle": 0}
            in_use = allocator.pages_in_use()
            return {
                "adapters_in_use": in_use,
                "adapters_idle": allocator.pool.num_lent_pages - in_use,
            }

    # -- requests (step thread) -------------------------------------------------------------

    def add_request(self, seq: Sequence) -> None:
        """A new waiting request: count the lookup, and start loading a cold adapter."""
        req = seq.lora_request
        if req is None:
            return
        m = self.metrics
        with self.lock:
            entry = self.adapters.get(req.adapter_id)
            if entry is None:
                entry = self.adapters[req.adapter_id] = AdapterEntry(req)
            elif entry.host is None and entry.slot is None:
                entry.request = req  # the newest path or name serves the next load
            entry.waiting.add(seq)
            m.lora_lookups["device"] += 1
            if entry.slot is not None:
                m.lora_hits["device"] += 1
                self.allocator.touch(req.adapter_id)
                return
            m.lora_lookups["host"] += 1
            if entry.host is not None:
                m.lora_hits["host"] += 1
                self.host_cache.touch(req.adapter_id)
                return
            self.host_cache.want(entry)

    def status_changed(self, seq: Sequence, old: SequenceStatus, new: SequenceStatus) -> None:
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
                entry.waiting.discard(seq)
            elif old is SequenceStatus.RUNNING:
                entry.running.discard(seq)
                seq.lora_slot = -1
            if new is SequenceStatus.WAITING:
                entry.waiting.add(seq)
            elif new is SequenceStatus.RUNNING:
                entry.running.add(seq)
                if self.allocator.admitting == req.adapter_id:
                    self.allocator.admitting = None  # its running request keeps it now

    def begin_schedule(self) -> None:
        """Before admitting anyone: the reserved adapter takes a slot if one is free now."""
        with self.lock:
            reserved = self.allocator.reserved
            entry = self.adapters.get(reserved) if reserved is not None else None
            if entry is None or entry.num_waiting == 0 or entry.slot is not None:
                self.allocator.release_reservation()
                return
            if entry.host is None:
                self.host_cache.want(entry)
                return
            slot = self.allocator.free_slot(entry)
            if slot is None:
                self.allocator.choose_draining(entry)
                return
            self._swap_in(entry, slot)
            self.allocator.release_reservation()

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
                if req.adapter_id == self.allocator.draining:
                    return False
                self.allocator.touch(req.adapter_id)
                seq.lora_slot = entry.slot
                self.allocator.admitting = req.adapter_id
                return True
            if entry.host is None:
                self.host_cache.want(entry)  # evicted from host since it was looked up
                return False
            if self.allocator.reserved not in (None, req.adapter_id):
                return False  # the next free slot is promised to an older adapter
            slot = self.allocator.free_slot(entry)
            if slot is None:
                if not self.allocator.pinned_out(entry):  # else waiting would block everyone
                    self.allocator.reserved = req.adapter_id
                    self.allocator.choose_draining(entry)
                return False
            self._swap_in(entry, slot)
            if self.allocator.reserved == req.adapter_id:
                self.allocator.release_reservation()
            seq.lora_slot = slot
            self.allocator.admitting = req.adapter_id
            return True

    def unacquire(self, seq: Sequence) -> None:
        """A request given its slot could not be admitted after all (no KV blocks): it
        waits on, and its adapter, idle again, may give its pages back."""
        with self.lock:
            seq.lora_slot = -1
            self.allocator.admitting = None

    def _swap_in(self, entry: AdapterEntry, slot: int) -> None:
        self.allocator.swap_in(entry, slot)
        self.host_cache.touch(entry.adapter_id)

    def _place_pinned(self) -> None:
        """Pinned adapters in host memory take a free (or idle) slot."""
        for entry in list(self.adapters.values()):
            if entry.pinned and entry.slot is None and entry.host is not None:
                if (slot := self.allocator.free_slot(entry)) is None:
                    return
                self._swap_in(entry, slot)

    def poll(self) -> list[tuple[str, AdapterLoadError]]:
        """At a step boundary: take in finished loads, start queued ones, bring pinned
        adapters into free slots. Returns (adapter id, error) of loads that failed; the
        engine fails the requests waiting for those."""
        with self.lock:
            failed = self.host_cache.take_finished()
            self.allocator.time_swaps()
            self.host_cache.start_loads()
            self._place_pinned()
        return failed

    def busy(self) -> bool:
        """Loads in flight or queued: the engine has work even with no request."""
        with self.lock:
            return self.host_cache.busy()

    def wait_for_load(self, timeout: float) -> bool:
        """Block until a load finishes (for callers that step the engine themselves)."""
        return self.loader.wait(timeout)

    # -- control (the engine's owner thread) ---------------------------------------------------

    def load(self, req: LoRARequest, pin: bool = False) -> Future[None]:
        """Bring an adapter into host memory ahead of its requests, and with `pin` keep it
        in a slot; the future resolves when it is in memory (or raises AdapterLoadError)."""
        future: Future[None] = Future()
        with self.lock:
            entry = self.adapters.get(req.adapter_id)
            if pin and not (entry is not None and entry.pinned):
                self._check_pin_room(req.name)
            if entry is None:
                entry = self.adapters[req.adapter_id] = AdapterEntry(req)
            if pin:
                self.pin(req.adapter_id)
            if entry.host is not None or entry.slot is not None:
                future.set_result(None)
                return future
            entry.futures.append(future)
            self.host_cache.want(entry)
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
            self.allocator.forget(entry)
            self.host_cache.forget(adapter_id)
            for future in entry.futures:
                future.cancel()
            del self.adapters[adapter_id]
            return True

    def pin(self, adapter_id: str, pinned: bool = True) -> None:
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
                    self.host_cache.want(entry)
            entry.pinned = pinned
            self._place_pinned()  # callers run between steps, so a swap-in is safe now

    def _check_pin_room(self, name: str) -> None:
        count = sum(a.pinned for a in self.adapters.values())
        num_slots = self.allocator.slots.num_slots
        if count + 1 >= num_slots:
            raise InvalidRequestError(
                f"cannot pin adapter {name!r}: {count} adapter(s) are pinned and max_loras is "
                f"{num_slots}; one slot must stay free for the other adapters"
            )

    def list_loras(self) -> list[dict[str, Any]]:
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
                    "rank": a.host.spec.max_rank if a.host else None,
                    "running": len(a.running),
                    "waiting": a.num_waiting,
                }
                for adapter_id, a in self.adapters.items()
            ]

    def stats(self) -> dict[str, Any]:
        with self.lock:
            entries = list(self.adapters.values())
            running = sorted({a.name for a in entries if a.running})
            waiting = sorted({a.name for a in entries if a.waiting})
            return {
                **self.metrics.lora_counters(),
                "slots_used": self.allocator.num_used,
                "host_bytes": self.host_cache.nbytes,
                "extras_bytes_used": self.allocator.slots.arena.used
                * self.allocator.slots.dtype.itemsize,
                "slots_total": self.allocator.slots.num_slots,
                "adapters_waiting": len(waiting),
                "running_adapters": running,
                "waiting_adapter_names": waiting,
                # the names clients sent (an alias, say), which routers match requests on
                "running_model_names": _model_names(a.running for a in entries),
                "waiting_model_names": _model_names(a.waiting for a in entries),
            }

    def shutdown(self) -> None:
        self.loader.shutdown()


def _model_names(groups: Iterable[set[Sequence]]) -> list[str]:
    return sorted({_model_name(seq) for seqs in groups for seq in seqs})


def _model_name(seq: Sequence) -> str:
    assert seq.lora_request is not None, "the manager tracks adapter requests only"
    return seq.model_name or seq.lora_request.name


def _fspath(path: str | os.PathLike[str] | None) -> str | None:
    return os.fspath(path) if path is not None else None
