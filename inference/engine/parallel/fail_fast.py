"""How a tensor-parallel group fails fast instead of hanging, on gloo and on NCCL alike.

Gloo's collectives block the host and raise when a peer's socket closes; NCCL's return at
once, so rank 0 would hang in its next host sync, and NCCL's own watchdog would then kill
the whole process. Here: NCCL aborts its communicator on an error instead of killing the
process, collectives stay asynchronous (no host sync each), and rank 0 times every step
itself (`StepClock`, read by the workers' watchdog), so a silent rank fails the engine the
same way on both backends; the group's own timeout is only the backstop, twice as long.
"""

import datetime
import logging
import os
import threading
import time

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

# set in every rank's process before its group starts (ProcessGroupNCCL reads them then)
NCCL_ENVIRONMENT = {
    # 2: on a timeout or an error, abort the communicator and leave the process running, so
    # that the engine reports it (1 and the default 3 tear the process down)
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "2",
    # 0: work.wait() does not block the host: a step keeps its one host sync
    "TORCH_NCCL_BLOCKING_WAIT": "0",
}
# the group's own timeout, a multiple of the step deadline: the watchdog acts first
BACKSTOP_FACTOR = 2


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def prepare_backend(backend: str) -> None:
    """Set what `backend` reads at the group's start (NCCL: NCCL_ENVIRONMENT, over any value
    already set: the others would kill the process on a lost rank)."""
    if backend == "nccl":
        os.environ.update(NCCL_ENVIRONMENT)


def group_timeout(step_deadline: float) -> datetime.timedelta:
    """The group's start and each collective's own limit (the backstop)."""
    return datetime.timedelta(seconds=BACKSTOP_FACTOR * step_deadline)


def abort_group() -> None:
    """Unblock a step stuck on a silent rank: NCCL's communicators are aborted, so the
    kernels waiting on the peer end and a host sync behind them returns; gloo's collectives
    raise once the peer's process is gone, which the caller sees to."""
    if not dist.is_initialized() or dist.get_backend() != "nccl":
        return
    try:
        dist.distributed_c10d._abort_process_group()
    except Exception:  # the engine fails either way; the abort only speeds it up
        logger.exception("aborting the NCCL communicators failed")


class StepClock:
    """When rank 0's running step started, for the watchdog thread to read: two clock reads
    a step, nothing on the device."""

    def __init__(self, deadline: float):
        self.deadline = deadline
        self._started: float | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            self._started = time.monotonic()

    def stop(self) -> float:
        """The step's duration, in seconds."""
        with self._lock:
            started, self._started = self._started, None
            assert started is not None, "stop() without start()"
            return time.monotonic() - started

    def overdue(self) -> float | None:
        """How long the running step has taken, once that reaches the deadline; else None."""
        with self._lock:  # so that a step it calls overdue finds itself overdue too
            if self._started is None:
                return None
            elapsed = time.monotonic() - self._started
        return elapsed if elapsed >= self.deadline else None
