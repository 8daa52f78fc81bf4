"""A GPU suite section in a process of its own, in its own process group, with a hard kill.

A signal cannot interrupt a long CUDA call, and a wedged device may never return from one.
At its cap a section's process group gets SIGTERM first (the section dumps every thread's
Python stack, so a hang says where it hung), then SIGKILL, which nothing can block; reaping
is bounded too, so a process stuck in the kernel cannot hold up the next section. The
section's stdout and stderr come back through one pipe: passed on to the suite's stderr as
they arrive, the last few thousand bytes kept for the report.

Sections are forked from the suite's process, which imported torch, transformers and the
engine once, so a section pays none of that again. Forking is safe while the parent never
touched CUDA (the parent imports with PYTORCH_NVML_BASED_CUDA_CHECK=1 so that an
availability check does not initialise it); `fork_is_safe` asks a forked child whether torch
would refuse CUDA there, and if so sections start as fresh interpreters instead.
"""

import contextlib
import ctypes
import os
import select
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

CHILD_SCRIPT = Path(__file__).resolve().with_name("gpu_suite_child.py")
TAIL_BYTES = 8000
DRAIN_S = 1.0  # how long output is still read once the section's process has exited
REAP_S = 5.0  # a SIGKILLed process's wait (freeing device memory) before it is left behind
SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGALRM}  # the suite's alone


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Holds back the suite's signals: a section started inside is recorded by the caller
    before an interruption can reach it, so it is always there to kill."""
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)


class Child:
    """A started section: its process id (also its process group's) and its output pipe."""

    def __init__(self, pid: int, output_fd: int):
        self.pid = pid
        self.fd: int | None = output_fd
        self.tail = b""
        self.status: int | None = None  # os.waitpid's status once reaped
        self.ended_by: str | None = None  # the signal the suite ended it with, if any
        self.left_behind = False  # not reaped within REAP_S of its SIGKILL

    def tail_text(self, limit: int = 3000) -> str:
        return self.tail.decode(errors="replace")[-limit:]

    def exit_code(self) -> int | None:
        return None if self.status is None else os.waitstatus_to_exitcode(self.status)

    def wait(self, deadline: float, grace: float) -> bool:
        """Pass its output on until it exits (True), or until `deadline` (time.monotonic):
        SIGTERM to its process group `grace` seconds before, SIGKILL at it (False). Either
        way nothing of the group is left running."""
        termed = False
        while True:
            if self._reap(block=False):
                self._drain(min(deadline, time.monotonic() + DRAIN_S))
                if termed:  # it ended of the SIGTERM: a timeout all the same
                    self.kill()
                    return False
                self.kill()  # whatever it started and left behind
                return True
            now = time.monotonic()
            if now >= deadline:
                self.ended_by = "SIGKILL"
                self.kill()
                return False
            if not termed and now >= deadline - grace:
                termed, self.ended_by = True, "SIGTERM"
                self._signal(signal.SIGTERM)
            step = min(deadline - now, 0.2) if termed else min(deadline - grace - now, 0.2)
            if self.fd is not None:
                self._read(max(step, 0))
            else:
                time.sleep(max(min(step, 0.05), 0))

    def kill(self, reap_s: float = REAP_S) -> None:
        """SIGKILL to the whole process group, then reap the section's process (waiting at
        most `reap_s`: one stuck in the kernel is left behind, and said to be)."""
        self._signal(signal.SIGKILL)
        until = time.monotonic() + reap_s
        while not self._reap(block=False) and time.monotonic() < until:
            time.sleep(0.01)
        self.left_behind = self.status is None
        self._drain(time.monotonic())  # what it wrote before dying is still in the pipe
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def _signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signum)

    def _reap(self, block: bool) -> bool:
        if self.status is None:
            try:
                pid, status = os.waitpid(self.pid, 0 if block else os.WNOHANG)
            except ChildProcessError:  # reaped already, its status lost to an interruption
                pid, status = self.pid, 255 << 8  # read as exit 255
            if pid == self.pid:
                self.status = status
        return self.status is not None

    def _drain(self, until: float) -> None:
        """Read what is there, and what comes until `until`; at least one look, and never
        past `until` while something (an escaped grandchild) keeps writing."""
        while self.fd is not None and self._read(max(until - time.monotonic(), 0)):
            if time.monotonic() > until:
                break

    def _read(self, timeout: float) -> bool:
        """Read what the pipe has within `timeout`; False once there is nothing more now."""
        assert self.fd is not None
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return False
        data = os.read(self.fd, 65536)
        if not data:  # every writer has closed its end
            os.close(self.fd)
            self.fd = None
            return False
        sys.stderr.buffer.write(data)
        sys.stderr.flush()
        self.tail = (self.tail + data)[-TAIL_BYTES:]
        return True


def start(function: str, profile: str, workdir: Path, result: Path, *, fork: bool) -> Child:
    """Start a section. Call it inside `signals_held()`: the child unblocks them itself."""
    sys.stdout.flush()
    sys.stderr.flush()
    read_fd, write_fd = os.pipe()
    try:
        pid = (
            _fork(function, profile, workdir, result, read_fd, write_fd)
            if fork
            else _spawn(function, profile, workdir, result, write_fd)
        )
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    return Child(pid, read_fd)


def _fork(
    function: str, profile: str, workdir: Path, result: Path, read_fd: int, write_fd: int
) -> int:
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the section's process
        code = 1
        try:
            os.setpgid(0, 0)
            for signum in SIGNALS:
                signal.signal(signum, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
            os.close(read_fd)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.close(null)
            os.dup2(write_fd, 1)
            os.dup2(write_fd, 2)
            os.close(write_fd)
            from gpu_suite_child import die_with, run_section

            die_with(parent)
            code = run_section(function, profile, workdir, result)
        finally:
            os._exit(code)  # never back into the parent's code; no waiting on threads
    with contextlib.suppress(PermissionError, ProcessLookupError):
        os.setpgid(pid, pid)  # also here, so a kill right after the fork finds the group
    return pid


def _spawn(function: str, profile: str, workdir: Path, result: Path, write_fd: int) -> int:
    """A fresh interpreter running gpu_suite_child.py, in a session of its own, with the
    parent's import path, no signals blocked and the suite's at their defaults."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    argv = [sys.executable, str(CHILD_SCRIPT), function, profile, str(workdir), str(result),
            str(os.getpid())]  # fmt: skip
    return os.posix_spawn(
        sys.executable,
        argv,
        env,
        file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, write_fd, 1),
            (os.POSIX_SPAWN_DUP2, write_fd, 2),
        ],
        setsid=True,
        setsigmask=(),
        setsigdef=tuple(SIGNALS),
    )


def fork_is_safe() -> bool:
    """Whether a forked child may still start CUDA: not once the parent initialised it,
    through torch or anything else that called the driver (Triton's, for one)."""
    if "torch" not in sys.modules and not _libcuda_loaded():
        return True  # nothing here could have touched CUDA
    pid = os.fork()
    if pid == 0:
        os._exit(0 if _cuda_usable_in_this_child() else 1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def _libcuda_loaded() -> bool:
    try:
        return "libcuda.so" in Path("/proc/self/maps").read_text()
    except OSError:
        return False


def _cuda_usable_in_this_child() -> bool:
    """In a forked child: torch's own verdict, then the driver's (cuInit fails in a child
    of a process that initialised it)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda._is_in_bad_fork():
        return False
    if not _libcuda_loaded():
        return True
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return True
    return libcuda.cuInit(0) == 0
