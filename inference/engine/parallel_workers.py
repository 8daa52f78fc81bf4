"""Ranks 1..N-1 of a tensor-parallel engine, and rank 0's side of them.

Rank 0 (the engine's process: scheduler, sampler, LoRA manager) starts one process per
other rank and sends each step's inputs down a pipe before running the step itself; every
rank then runs the same forward, meeting at the sharded layers' collectives. A worker
repeats rank 0's slot writes with its own copy of each adapter, its shard, read from the
same folder during rank 0's load and held as long as rank 0 holds one (parallel_adapters.py),
so a folder gone from disk fails that adapter's load, never a step.

Nothing hangs on a lost rank: a watchdog thread in rank 0 fails the engine (its requests end
with RankFailedError, readiness turns false) when a worker exits, or when a step runs past
LORAPLEX_TP_TIMEOUT_SECONDS, a rank having stopped answering: it then kills the workers and
aborts the group, which ends the collective or host sync the step waits in, on gloo and on
NCCL alike (parallel/fail_fast.py); a worker whose rank 0 went away sees its pipe close and
exits.
"""

import contextlib
import copy
import dataclasses
import logging
import multiprocessing
import os
import pickle
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Protocol

import torch

from .config import EngineConfig
from .errors import ConfigError
from .lora.slots import LoRASlots
from .model_inputs import ForwardInputs
from .parallel.fail_fast import StepClock, abort_group
from .parallel.group import TIMEOUT_ENV, free_address, join_group, leave_group, timeout_seconds
from .parallel_adapters import RankLoads, WorkerAdapters, serve_loads
from .request import LoRARequest

logger = logging.getLogger(__name__)

WATCH_INTERVAL_SECONDS = 0.2
STOP_TIMEOUT_SECONDS = 10.0
# a collective fails as soon as a dead peer's sockets close, a moment before its exit can be
# seen: how long a failed step waits for that, to name the rank
EXIT_GRACE_SECONDS = 1.0

# a slot write: (slot, (the adapter's request, its folder)), or (slot, None): cleared
SlotWrite = tuple[int, tuple[LoRARequest, str] | None]


class RankFailedError(RuntimeError):
    """A rank of the tensor-parallel group died or stopped answering: the engine cannot run
    another step."""


@dataclass
class StepInputs:
    """What every rank needs to run rank 0's step: its forward's inputs as rank 0 built them
    on the host (each rank uploads them itself, so nothing comes back from rank 0's
    device), the slot writes since the last step, and, by rank, the adapter copies to let go
    after them."""

    forward: ForwardInputs
    writes: list[SlotWrite]
    released: dict[int, list[str]] = field(default_factory=dict)
    # KV blocks rank 0 moved out of a slot group since the last step (src page, dst page),
    # repeated before the slot writes that overwrite their old pages
    page_moves: list[tuple[int, int]] = field(default_factory=list)


class Follower(Protocol):
    """A worker's runner (model_runner.ModelRunner): its adapter slots, and its step."""

    @property
    def lora_slots(self) -> LoRASlots | None: ...

    def follow(self, inputs: StepInputs) -> None: ...

    def move_pages(self, moves: list[tuple[int, int]]) -> None: ...


# Builds a worker's runner from (config, rank): the runner class, passed in by rank 0's
# runner so that this module need not import it; it reaches the worker pickled by name.
MakeFollower = Callable[[EngineConfig, int], Follower]


def process_name(rank: int) -> str:
    """A worker's name, in multiprocessing and to the OS (`ps -o comm`, which keeps 15
    characters), so that an operator can tell the ranks apart."""
    return f"loraplex-tp-{rank}"


def device_for(config: EngineConfig, rank: int) -> torch.device:
    device = torch.device(config.device)
    return torch.device("cuda", rank) if device.type == "cuda" else device


class Workers:
    """Rank 0's handle on the other ranks: started and joined to the group on creation."""

    def __init__(self, config: EngineConfig, make_follower: MakeFollower):
        if torch.distributed.is_initialized():
            raise ConfigError(
                "this process already hosts a tensor-parallel engine (or another "
                "torch.distributed group); a process runs one tensor-parallel engine at a "
                "time: close the other first"
            )
        size = config.tensor_parallel_size
        address = free_address()
        context = multiprocessing.get_context("spawn")  # CUDA and threads forbid fork
        self.pipes: list[Connection] = []
        load_pipes: list[Connection] = []
        self.processes: list[multiprocessing.process.BaseProcess] = []
        for rank in range(1, size):
            ours, theirs = context.Pipe()
            our_loads, their_loads = context.Pipe()
            process = context.Process(
                target=worker_main,
                args=(config, rank, address, theirs, their_loads, make_follower),
                name=process_name(rank),
                daemon=True,
            )
            process.start()
            theirs.close()
            their_loads.close()
            self.pipes.append(ours)
            load_pipes.append(our_loads)
            self.processes.append(process)
        self.loads = RankLoads(load_pipes)  # the adapter loader's way to the other ranks
        self.failure: RankFailedError | None = None
        self.on_failure: Callable[[], None] | None = None  # the engine's wakeup
        self.clock = StepClock(timeout_seconds())
        self._closing = threading.Event()
        self._watchdog = threading.Thread(
            target=self._watch, name="loraplex-tp-watchdog", daemon=True
        )
        self._watchdog.start()
        try:
            join_group(address, 0, size, device_for(config, 0))
        except Exception:
            self.close()
            raise

    def check(self) -> None:
        if self.failure is not None:
            raise self.failure

    @contextlib.contextmanager
    def watch_step(self) -> Iterator[None]:
        """Rank 0's step, its host sync included, under the deadline: one that fails once
        the group has raises the group's error, and one that took the deadline or longer
        fails even if it returned (under NCCL, an aborted collective's results are void)."""
        self.check()
        self.clock.start()
        try:
            yield
        except Exception as e:
            if self.failure is not None and e is not self.failure:
                raise self.failure from e
            raise
        finally:
            elapsed = self.clock.stop()
        if self.failure is None and elapsed >= self.clock.deadline:
            self.failure = self._hung(elapsed)
        self.check()

    def send(self, inputs: StepInputs) -> None:
        self.check()
        inputs = dataclasses.replace(inputs, released=self.loads.take_released())
        data = pickle.dumps(inputs, protocol=pickle.HIGHEST_PROTOCOL)
        for rank, pipe in enumerate(self.pipes, start=1):
            try:
                pipe.send_bytes(data)
            except OSError as e:
                raise self.failed(f"rank {rank} cannot be reached ({e})") from e

    def failed(self, cause: str) -> RankFailedError:
        """The error for a step that failed with `cause` (a collective's error, a closed
        pipe): the dead rank's when one exited."""
        deadline = time.monotonic() + EXIT_GRACE_SECONDS
        self._scan()
        while self.failure is None and time.monotonic() < deadline:
            time.sleep(0.01)
            self._scan()
        if self.failure is None:
            self.failure = RankFailedError(f"the tensor-parallel group failed: {cause}")
        return self.failure

    def _scan(self) -> None:
        for rank, process in enumerate(self.processes, start=1):
            if self.failure is None and not process.is_alive():
                self.failure = RankFailedError(
                    f"tensor-parallel rank {rank} (pid {process.pid}) exited with code "
                    f"{process.exitcode}; the engine cannot run without it"
                )

    def _hung(self, elapsed: float) -> RankFailedError:
        return RankFailedError(
            f"a tensor-parallel step did not finish within {self.clock.deadline:g} s "
            f"({TIMEOUT_ENV}; {elapsed:.1f} s so far): a rank stopped answering"
        )

    def _watch(self) -> None:
        """Until closed: fail the engine on a worker's exit or a step past the deadline; then
        kill the workers left and abort the group, which ends the collective or host sync a
        step may be waiting in (NCCL's do not end on their own), and wake the engine."""
        while not self._closing.wait(WATCH_INTERVAL_SECONDS):
            if self.failure is None:
                self._scan()
                elapsed = self.clock.overdue()
                if self.failure is None and elapsed is not None:
                    self.failure = self._hung(elapsed)
            if self.failure is not None:
                logger.error("%s", self.failure)
                for process in self.processes:
                    process.kill()
                abort_group()
                if self.on_failure is not None:
                    self.on_failure()
                return

    def close(self) -> None:
        """Stop the workers (an empty message), then leave the group (once the watchdog, which
        may be aborting it, has returned)."""
        self._closing.set()
        if self._watchdog is not threading.current_thread():
            self._watchdog.join(STOP_TIMEOUT_SECONDS)
        for pipe in self.pipes:
            with contextlib.suppress(OSError):  # a dead rank's pipe is already broken
                pipe.send_bytes(b"")
            pipe.close()
        for pipe in self.loads.pipes:
            pipe.close()
        for process in self.processes:
            process.join(STOP_TIMEOUT_SECONDS)
            if process.is_alive():
                process.kill()
                process.join(STOP_TIMEOUT_SECONDS)
        leave_group()


def apply_writes(adapters: WorkerAdapters, writes: list[SlotWrite]) -> None:
    """Repeat rank 0's slot writes with this rank's held copies."""
    for slot, write in writes:
        if write is None:
            adapters.slots.clear(slot)
        else:
            adapters.slots.write(slot, adapters.copy_of(*write))


def worker_main(
    config: EngineConfig,
    rank: int,
    address: str,
    pipe: Connection,
    loads: Connection,
    make_follower: MakeFollower,
) -> None:
    """A worker process: join the group, build this rank's shard, then run every step rank 0
    sends until it sends an empty message or its pipe closes; a thread loads the adapters
    rank 0 loads, down `loads`."""
    with contextlib.suppress(OSError):  # Linux; elsewhere the OS keeps calling it python
        Path("/proc/self/comm").write_text(process_name(rank))
    config = copy.copy(config)
    device = device_for(config, rank)
    config.device = str(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    join_group(address, rank, config.tensor_parallel_size, device)
    try:
        runner = make_follower(config, rank)
        adapters = WorkerAdapters(runner.lora_slots, config) if runner.lora_slots else None
        if adapters is not None:
            threading.Thread(
                target=serve_loads, args=(loads, adapters), name="loraplex-tp-loads", daemon=True
            ).start()
        while True:
            try:
                data = pipe.recv_bytes()
            except EOFError:
                break
            if not data:
                break
            inputs: StepInputs = pickle.loads(data)
            if inputs.page_moves:
                runner.move_pages(inputs.page_moves)
            if inputs.writes or inputs.released:
                assert adapters is not None, "slot writes reach only engines with LoRA"
                apply_writes(adapters, inputs.writes)
                adapters.release(inputs.released.get(rank, ()))
            runner.follow(inputs)
    finally:
        leave_group()
    os._exit(0)  # skip interpreter teardown: nothing of this process outlives it
