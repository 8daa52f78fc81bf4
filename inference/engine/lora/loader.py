"""Loading an adapter, off the step thread: its folder (or one the loader callback stages),
every PEFT rule (`peft_rules.load_adapter`, the one copy of the rules), then one slot row
in host memory (pinned on CUDA), ready to be copied into a device slot, and the adapter's
extras (DoRA scales computed against the base weights, LoRA on embed_tokens / lm_head,
saved heads) when it has any.

A folder that fails to load may hold damaged bytes rather than a bad adapter: the loader
callback is asked once more, naming that folder, so that a stager can check it against its
digests and fetch it again (the request waits for the fresh copy, or fails alone). Under
tensor parallelism the other ranks load their shards as part of the same load
(parallel_adapters.py), so a load succeeds only when every rank holds the adapter.

Results wait in a queue until the host cache takes them in at a step boundary; `wakeup`
tells a sleeping step loop that one arrived.
"""

import dataclasses
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import torch

from ..errors import AdapterLoadError
from ..request import LoRARequest
from ..utils import drain
from .peft_rules import AdapterError, ArchFingerprint, load_adapter
from .slots import HostAdapter, LoRASlots

logger = logging.getLogger(__name__)

LOAD_WORKERS = 2
# The engine's loader callback: an adapter's local folder, staged first if it is not on local
# disk. Called with the request as sent when its folder is missing (path None, or not a
# folder), and once more with `path` the folder that failed to load: a callback that stages
# checks that copy's bytes and fetches a fresh one if they are damaged.
FetchAdapter = Callable[[LoRARequest], str | os.PathLike[str]]


class OtherRanks(Protocol):
    """Tensor parallelism's other ranks (parallel_adapters.RankLoads): each loads and holds
    its shard of an adapter rank 0 loaded, until rank 0's copy is released."""

    def load(self, request: LoRARequest, path: str) -> None: ...

    def release(self, adapter_id: str) -> None: ...


@dataclass
class LoadResult:
    adapter_id: str
    token: object  # the manager's token for this load, to ignore one it has since forgotten
    adapter: HostAdapter | None
    error: AdapterLoadError | None
    seconds: float
    tier: str  # "disk" (the request's folder) or "loader" (the callback fetched it)


class AdapterLoader:
    def __init__(
        self,
        slots: LoRASlots,
        fingerprint: ArchFingerprint,
        callback: FetchAdapter | None = None,
    ):
        self.slots = slots
        self.fingerprint = fingerprint
        self.callback = callback
        self.ranks: OtherRanks | None = None  # set by the engine under tensor parallelism
        self.wakeup: Callable[[], None] | None = None
        self._done: queue.SimpleQueue[LoadResult] = queue.SimpleQueue()
        self._loaded = threading.Event()
        self._pin_memory = slots.device.type == "cuda"
        self._executor = ThreadPoolExecutor(
            LOAD_WORKERS, thread_name_prefix="loraplex-lora-load", initializer=one_torch_thread
        )

    def submit(self, req: LoRARequest, token: object) -> None:
        self._executor.submit(self._load, req, token)

    def finished(self) -> Iterator[LoadResult]:
        """The loads that ended since the last call."""
        return drain(self._done)

    def wait(self, timeout: float) -> bool:
        done = self._loaded.wait(timeout)
        self._loaded.clear()
        return done

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _load(self, req: LoRARequest, token: object) -> None:
        """On a loader thread: folder (or loader callback) -> checked tensors -> slot row, and
        the other ranks' copies under tensor parallelism."""
        start, tier, adapter, error = time.perf_counter(), "disk", None, None
        try:
            path, tier = self._folder(req)
            adapter, tier = self._read(req, path, tier)
            if self.ranks is not None:
                self._share(adapter, self.ranks)
        except Exception as e:  # a broken disk or loader must fail these requests, not hang them
            if not isinstance(e, AdapterError | AdapterLoadError):
                logger.exception("loading adapter %s failed", req.adapter_id)
            adapter = None
            error = AdapterLoadError(
                f"adapter {req.name!r} ({req.adapter_id}) cannot be served: {_reason(e)}"
            )
        self._done.put(
            LoadResult(req.adapter_id, token, adapter, error, time.perf_counter() - start, tier)
        )
        self._loaded.set()
        if self.wakeup is not None:
            self.wakeup()

    def _folder(self, req: LoRARequest) -> tuple[str | os.PathLike[str], str]:
        """(folder, tier): the request's, else the one the loader callback stages."""
        path = req.path
        if path is not None and os.path.isdir(path):
            return path, "disk"
        if self.callback is None:
            raise AdapterLoadError(
                f"adapter folder {os.fspath(path)!r} does not exist"
                if path is not None
                else "the request names no folder and the engine has no loader"
            )
        return self._fetch(req), "loader"

    def _fetch(self, req: LoRARequest) -> str | os.PathLike[str]:
        """The callback's folder. Asked twice when the first is gone by the time it is
        looked at: another stager on the host may have been putting its own copy in place."""
        assert self.callback is not None
        for _ in range(2):
            try:
                path = self.callback(req)
            except Exception as e:
                raise AdapterLoadError(f"the loader could not fetch it: {e}") from e
            if path is not None and os.path.isdir(path):
                return path
        raise AdapterLoadError(f"the loader returned {path!r}, which is not a folder")

    def _read(
        self, req: LoRARequest, path: str | os.PathLike[str], tier: str
    ) -> tuple[HostAdapter, str]:
        """(adapter, tier). A folder that fails to load is named to the loader callback,
        which may fetch it again (its bytes damaged on disk); the folder it gives is read
        once more, and its failure is the load's."""
        try:
            return self._host_adapter(req, path), tier
        except Exception as first:
            if self.callback is None:
                raise
            logger.warning(
                "adapter %s failed to load from %s (%s); asking the loader to check its copy",
                req.adapter_id,
                os.fspath(path),
                _reason(first),
            )
            try:
                again = self._fetch(dataclasses.replace(req, path=os.fspath(path)))
            except AdapterLoadError as e:
                raise AdapterLoadError(f"{_reason(first)}; then {e}") from first
            return self._host_adapter(req, again), "loader"

    def _host_adapter(self, req: LoRARequest, path: str | os.PathLike[str]) -> HostAdapter:
        return load_host_adapter(self.slots, req, path, self.fingerprint, pin=self._pin_memory)

    @staticmethod
    def _share(adapter: HostAdapter, ranks: OtherRanks) -> None:
        """The other ranks read their shards from the same folder now, while it is known to
        be there; each holds its copy until this one is garbage, whatever the disk does."""
        ranks.load(adapter.request, adapter.path)
        weakref.finalize(adapter, ranks.release, adapter.request.adapter_id)


def _reason(e: BaseException) -> str:
    return str(e) if isinstance(e, AdapterError | AdapterLoadError) else f"{type(e).__name__}: {e}"


def load_host_adapter(
    slots: LoRASlots,
    request: LoRARequest,
    path: str | os.PathLike[str],
    fingerprint: ArchFingerprint,
    *,
    pin: bool,
) -> HostAdapter:
    """An adapter folder, every PEFT rule checked, as one slot row (and its extras) in host
    memory; AdapterError says why one cannot be served."""
    spec, tensors = load_adapter(
        path,
        fingerprint,
        max_lora_rank=slots.max_rank,
        max_saved_params=slots.max_saved_params,
    )
    row, extras = slots.pack(spec, tensors, pin=pin)
    return HostAdapter(request, spec, row, os.fspath(path), extras)


def one_torch_thread() -> None:
    """Loader threads run their torch ops on one thread. A thread that has run a parallel
    region keeps an OpenMP team of its own alive, and on a small CPU that team made every
    later small op of the step thread several times slower (the LoRA matmuls of a decode
    step among them). One thread per load is plenty: a load is a file read and a few copies."""
    torch.set_num_threads(1)
