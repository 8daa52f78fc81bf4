"""Adapters in host memory, and the loads that bring them there from disk.

At most `max_cpu_loras` host copies (pinned memory on CUDA) and `max_bytes` of them (an
adapter's extras, such as a saved head, can make it far larger than a slot row), least
recently used evicted first, but never one that a waiting request or a pin still needs to
swap in. Loads run on
the loader's threads (loader.py) and are taken in at a step boundary, so the step thread
never waits for a disk or the network; one load serves every request for an adapter (single
flight), and loads wait in a queue while their results would not fit next to the copies
still needed.
"""

from collections import OrderedDict

from ..errors import AdapterLoadError
from ..metrics import EngineMetrics
from .entry import AdapterEntry
from .loader import AdapterLoader


class HostCache:
    def __init__(
        self,
        adapters: dict[str, AdapterEntry],
        capacity: int,
        metrics: EngineMetrics,
        loader: AdapterLoader,
        max_bytes: int,
    ):
        self.adapters = adapters  # the manager's table, shared
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.metrics = metrics
        self.loader = loader
        self.lru: OrderedDict[str, None] = OrderedDict()  # in host memory, least recent first
        self.load_queue: OrderedDict[str, None] = OrderedDict()  # loads waiting for room

    def touch(self, adapter_id: str) -> None:
        if adapter_id in self.lru:
            self.lru.move_to_end(adapter_id)

    def want(self, entry: AdapterEntry) -> None:
        """Load an adapter unless it is loading or queued already (single flight)."""
        if entry.load is None and not entry.queued:
            entry.queued = True
            self.load_queue[entry.adapter_id] = None
            self.start_loads()

    def start_loads(self) -> None:
        """Start queued loads, oldest first, while host memory has room for their results
        next to the adapters that requests are waiting to swap in."""
        loading = sum(1 for a in self.adapters.values() if a.load is not None)
        needed = sum(1 for i in self.lru if self.adapters[i].needs_host)
        while self.load_queue and needed + loading < self.capacity:
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

    def take_finished(self) -> list[tuple[str, AdapterLoadError]]:
        """Take in the loads that ended: a loaded adapter joins host memory and its
        `load_lora` callers are answered. Returns (adapter id, error) of those that failed;
        an adapter known only from the failed load is forgotten."""
        failed = []
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
            entry.host, entry.source = result.adapter, result.tier
            self.lru[result.adapter_id] = None
            self._shrink()
            for future in entry.futures:
                future.set_result(None)
            entry.futures.clear()
        return failed

    @property
    def nbytes(self) -> int:
        """Bytes of the host copies, extras included."""
        return sum(h.nbytes for i in self.lru if (h := self.adapters[i].host) is not None)

    def _shrink(self) -> None:
        """Evict least recently used host copies that nobody waits to swap in."""
        nbytes = self.nbytes
        for adapter_id in list(self.lru):
            if len(self.lru) <= self.capacity and nbytes <= self.max_bytes:
                return
            entry = self.adapters[adapter_id]
            if not entry.needs_host:
                nbytes -= entry.host.nbytes if entry.host is not None else 0
                entry.host = None
                del self.lru[adapter_id]
                self.metrics.lora_evictions["host"] += 1

    def forget(self, adapter_id: str) -> None:
        """An adapter is unloaded: drop its host copy and any queued load."""
        self.lru.pop(adapter_id, None)
        self.load_queue.pop(adapter_id, None)

    def busy(self) -> bool:
        """Loads in flight or queued."""
        return any(a.load is not None or a.queued for a in self.adapters.values())
