"""Celery worker processes a fault test can kill, on a broker of the test's own."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.processes import ROOT, database_url


def start_worker(log: Path, *, beat: bool = False, **env: str) -> subprocess.Popen:
    """`celery worker -P solo` on the test database with `env` over this process's (with
    `beat`, Celery beat inside it, as deployments run one worker); waits until it says it is
    ready."""
    full_env = {**os.environ, "DATABASE_URL": database_url(), **env}
    with_beat = ["-B", "-s", str(log.with_suffix(".beat-schedule"))] if beat else []
    with open(log, "a") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "platform_site", "worker", "-P", "solo"]
            + ["-l", "INFO", "--without-heartbeat", "--without-gossip", "--without-mingle"]
            + ["-n", f"fault-{time.monotonic_ns()}@%h", *with_beat],
            cwd=ROOT,
            env=full_env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: beat's child goes with it (`kill`)
        )
    deadline = time.monotonic() + 60
    while " ready." not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"worker did not start:\n{log.read_text()}")
        time.sleep(0.1)
    return proc


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL to the worker's whole process group, as a lost node or a container's kill: no
    word to the broker, and nothing of it (beat's child process) left running."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            kill(proc)
