"""Celery worker processes a fault test can kill, on a broker of the test's own."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.processes import ROOT, database_url


def start_worker(log: Path, **env: str) -> subprocess.Popen:
    """`celery worker -P solo` on the test database with `env` over this process's; waits
    until it says it is ready."""
    full_env = {**os.environ, "DATABASE_URL": database_url(), **env}
    with open(log, "a") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "platform_site", "worker", "-P", "solo"]
            + ["-l", "INFO", "--without-heartbeat", "--without-gossip", "--without-mingle"]
            + ["-n", f"fault-{time.monotonic_ns()}@%h"],
            cwd=ROOT,
            env=full_env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 60
    while " ready." not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"worker did not start:\n{log.read_text()}")
        time.sleep(0.1)
    return proc


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
