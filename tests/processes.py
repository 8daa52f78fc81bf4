"""Starting `serve` (or a stand-in for it) as a real process, for tests of the HTTP stack."""

from __future__ import annotations

import random
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import httpx

ROOT = Path(__file__).resolve().parents[1]
SERVE = ("manage.py", "serve", "--log-level", "warning")
T = TypeVar("T")


PORT_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port() -> int:
    """A free port below the ephemeral range, as a deployment's fixed port is: a port the
    kernel hands out for `bind(0)` is released here and could be handed again, before the
    child binds it, to the child's own `bind(0)` (its tensor-parallel rendezvous does one)."""
    low = int(PORT_RANGE.read_text().split()[0]) if PORT_RANGE.exists() else 32768
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port below {low}")


def database_url() -> str:
    """The test database, as a URL a child process can be given."""
    from django.db import connection

    db = connection.settings_dict
    if connection.vendor == "postgresql":
        return (
            f"postgres://{db['USER']}:{db['PASSWORD'] or ''}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
        )
    return f"sqlite:///{db['NAME']}"


def committed(read: Callable[[], T]) -> T:
    """`read()` on a database connection of its own: what the live processes have committed.

    A `django_db` test runs inside one transaction, and on SQLite (WAL) every read in it sees
    the snapshot its first read took: rows a live server commits after that stay invisible to
    the test, however long it waits. Another thread has its own connection (Django's are per
    thread), outside that transaction, and sees every commit so far. Evaluate querysets inside
    `read` (`list(...)`, `.count()`).
    """
    from django.db import connection

    def run() -> T:
        try:
            return read()
        finally:
            connection.close()  # this thread's: none is left open on the test database

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


def launch(
    tmp: Path,
    env: dict[str, str],
    *,
    args: Sequence[str] = SERVE,
    name: str = "serve",
    ready_path: str = "/readyz",
    timeout: float = 120,
) -> tuple[str, subprocess.Popen, Path]:
    """Run `python <args> --port N` and wait until `ready_path` answers 200. A process that
    exits or never gets ready is killed, and the error carries its log."""
    port = free_port()
    log = tmp / f"{name}-{port}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, *args, "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{url}{ready_path}", timeout=2).status_code == 200:
                return url, proc, log
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{name} did not become ready:\n{log.read_text()}")
        time.sleep(0.3)
