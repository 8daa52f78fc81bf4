"""Adapters under tensor parallelism: every rank's own copy, read from disk with rank 0's load.

Rank 0 loads an adapter on a loader thread (lora/loader.py), then asks each other rank to
load its shard from the same folder (`RankLoads.load`, down a pipe of its own, answered by
a thread in the worker), and the load succeeds only when every rank holds its copy: a rank
that cannot read the folder (the disk cache evicted it meanwhile, say) fails that load, and
so only that adapter's requests, never a step. A worker keeps each copy as long as rank 0
keeps one: when rank 0's copy is dropped, the release travels with the next step's inputs,
after the slot writes that may still use it, so a slot write never reads the disk.
"""

import logging
import pickle
import threading
from collections.abc import Iterable
from multiprocessing.connection import Connection

from .config import EngineConfig
from .errors import AdapterLoadError
from .lora.loader import load_host_adapter, one_torch_thread
from .lora.slots import HostAdapter, LoRASlots
from .request import LoRARequest

logger = logging.getLogger(__name__)


class RankLoads:
    """Rank 0's side: the other ranks' loads (one at a time), and the releases each rank
    is owed, sent with the next step's inputs."""

    def __init__(self, pipes: list[Connection]):
        self.pipes = pipes  # rank 1's first
        self._lock = threading.Lock()  # one load at a time: answers arrive in order
        self._released: dict[int, list[str]] = {}
        # reentrant: a release runs in a finalizer, which garbage collection may start
        # anywhere, this lock held by the same thread included
        self._released_lock = threading.RLock()

    def load(self, request: LoRARequest, path: str) -> None:
        """Every other rank loads and holds its copy; AdapterLoadError names each rank that
        could not (those that did let theirs go with the next step)."""
        data = pickle.dumps((request, path), protocol=pickle.HIGHEST_PROTOCOL)
        failures, loaded = [], []
        with self._lock:
            for rank, pipe in enumerate(self.pipes, start=1):
                problem = _ask(pipe, data)
                if problem is None:
                    loaded.append(rank)
                else:
                    failures.append(f"tensor-parallel rank {rank} could not load it: {problem}")
        if failures:
            self._owe(request.adapter_id, loaded)
            raise AdapterLoadError("; ".join(failures))

    def release(self, adapter_id: str) -> None:
        """Rank 0 dropped a copy it loaded: every rank lets one go. From any thread."""
        self._owe(adapter_id, range(1, len(self.pipes) + 1))

    def take_released(self) -> dict[int, list[str]]:
        """By rank, the copies to let go after this step's slot writes."""
        with self._released_lock:
            released, self._released = self._released, {}
        return released

    def _owe(self, adapter_id: str, ranks: Iterable[int]) -> None:
        with self._released_lock:
            for rank in ranks:
                self._released.setdefault(rank, []).append(adapter_id)


def _ask(pipe: Connection, data: bytes) -> str | None:
    """One load on one rank: None when it holds its copy, else why not."""
    try:
        pipe.send_bytes(data)
        answer = pipe.recv()
    except (EOFError, OSError) as e:
        return f"it cannot be reached ({type(e).__name__}: {e})"
    return None if answer is None else str(answer)


class WorkerAdapters:
    """A worker's host copies of adapters, by adapter id, each held as many times as rank 0
    holds a copy of it (versions never change: one copy serves every hold)."""

    def __init__(self, slots: LoRASlots, config: EngineConfig):
        self.fingerprint = config.model_config.fingerprint
        self.slots = slots
        self.pin = slots.device.type == "cuda"
        self._lock = threading.Lock()  # the load thread holds, the step loop writes slots
        self._held: dict[str, tuple[HostAdapter, int]] = {}

    def hold(self, request: LoRARequest, path: str) -> None:
        """On the load thread: this rank's shard, read from `path` unless already held."""
        with self._lock:
            held = self._held.get(request.adapter_id)
            if held is not None:
                self._held[request.adapter_id] = (held[0], held[1] + 1)
                return
        adapter = load_host_adapter(self.slots, request, path, self.fingerprint, pin=self.pin)
        with self._lock:
            held = self._held.get(request.adapter_id)
            count = held[1] if held is not None else 0
            self._held[request.adapter_id] = (adapter, count + 1)

    def release(self, adapter_ids: Iterable[str]) -> None:
        with self._lock:
            for adapter_id in adapter_ids:
                held = self._held.get(adapter_id)
                if held is None:
                    continue
                if held[1] > 1:
                    self._held[adapter_id] = (held[0], held[1] - 1)
                else:
                    del self._held[adapter_id]

    def copy_of(self, request: LoRARequest, path: str) -> HostAdapter:
        """The held copy a slot write needs. One that is not held (which rank 0's loads
        rule out) is read from disk as a last resort."""
        with self._lock:
            held = self._held.get(request.adapter_id)
        if held is not None:
            return held[0]
        logger.warning("adapter %s was not held by this rank: reading %s", request.adapter_id, path)
        return load_host_adapter(self.slots, request, path, self.fingerprint, pin=self.pin)

    @property
    def num_held(self) -> int:
        with self._lock:
            return len(self._held)


def serve_loads(pipe: Connection, adapters: WorkerAdapters) -> None:
    """A worker's load thread: hold each adapter rank 0 sends, answer None or why not, until
    the pipe closes."""
    one_torch_thread()
    while True:
        try:
            request, path = pickle.loads(pipe.recv_bytes())
        except (EOFError, OSError):
            return
        try:
            adapters.hold(request, path)
            answer = None
        except Exception as e:  # a missing or unreadable folder fails this load, not the rank
            logger.warning(
                "rank could not load adapter %s from %s: %s", request.adapter_id, path, e
            )
            answer = f"{type(e).__name__}: {e}"
        try:
            pipe.send(answer)
        except OSError:
            return
