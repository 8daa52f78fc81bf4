"""Starting `serve` (or a stand-in for it) as a real process, for tests of the HTTP stack."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
SERVE = ("manage.py", "serve", "--log-level", "warning")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def database_url() -> str:
    """The test database, as a URL a child process can be given."""
    from django.db import connection

    db = connection.settings_dict
    if connection.vendor == "postgresql":
        return (
            f"postgres://{db['USER']}:{db['PASSWORD'] or ''}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
        )
    return f"sqlite:///{db['NAME']}"


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
