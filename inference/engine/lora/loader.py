"""Loading an adapter, off the step thread: its folder (or one the loader callback stages),
every PEFT rule (`peft_rules.load_adapter`, the one copy of the rules), then one slot row
in host memory (pinned on CUDA), ready to be copied into a device slot, and the adapter's
extras (DoRA scales computed against the base weights, LoRA on embed_tokens / lm_head,
saved heads) when it has any.

Results wait in a queue until the host cache takes them in at a step boundary; `wakeup`
tells a sleeping step loop that one arrived.
"""

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from ..errors import AdapterLoadError
from ..request import LoRARequest
from ..utils import drain
from .peft_rules import AdapterError, ArchFingerprint, load_adapter
from .slots import HostAdapter, LoRASlots

logger = logging.getLogger(__name__)

LOAD_WORKERS = 2
# The engine's loader callback: stage an adapter that is not on local disk, return its folder.
FetchAdapter = Callable[[LoRARequest], str | os.PathLike[str]]


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
        self.wakeup: Callable[[], None] | None = None
        self._done: queue.SimpleQueue[LoadResult] = queue.SimpleQueue()
        self._loaded = threading.Event()
        self._pin_memory = slots.device.type == "cuda"
        self._executor = ThreadPoolExecutor(
            LOAD_WORKERS, thread_name_prefix="loraplex-lora-load", initializer=_one_torch_thread
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
        """On a loader thread: folder (or loader callback) -> checked tensors -> slot row."""
        start, tier, adapter, error = time.perf_counter(), "disk", None, None
        try:
            path = req.path
            if path is None or not os.path.isdir(path):
                if self.callback is None:
                    raise AdapterLoadError(
                        f"adapter folder {os.fspath(path)!r} does not exist"
                        if path is not None
                        else "the request names no folder and the engine has no loader"
                    )
                tier = "loader"
                try:
                    path = self.callback(req)
                except Exception as e:
                    raise AdapterLoadError(f"the loader could not fetch it: {e}") from e
                if path is None or not os.path.isdir(path):
                    raise AdapterLoadError(f"the loader returned {path!r}, which is not a folder")
            adapter = load_host_adapter(
                self.slots, req, path, self.fingerprint, pin=self._pin_memory
            )
        except (AdapterError, AdapterLoadError) as e:
            error = AdapterLoadError(
                f"adapter {req.name!r} ({req.adapter_id}) cannot be served: {e}"
            )
        except Exception as e:  # a broken disk or loader must fail these requests, not hang them
            logger.exception("loading adapter %s failed", req.adapter_id)
            error = AdapterLoadError(
                f"adapter {req.name!r} ({req.adapter_id}) cannot be served: {type(e).__name__}: {e}"
            )
        self._done.put(
            LoadResult(req.adapter_id, token, adapter, error, time.perf_counter() - start, tier)
        )
        self._loaded.set()
        if self.wakeup is not None:
            self.wakeup()


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


def _one_torch_thread() -> None:
    """Loader threads run their torch ops on one thread. A thread that has run a parallel
    region keeps an OpenMP team of its own alive, and on a small CPU that team made every
    later small op of the step thread several times slower (the LoRA matmuls of a decode
    step among them). One thread per load is plenty: a load is a file read and a few copies."""
    torch.set_num_threads(1)
