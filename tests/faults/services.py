"""Private service processes for fault tests: a Redis and a PostgreSQL of the test's own.

The machine's services are shared (other tests and people use them), so a test that stops
or restarts a service starts its own on a free port and points a live process at it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.processes import free_port
from tests.waiting import wait_for


def require(binary: str | None, what: str) -> str:
    """The binary's path; a skip saying why without it (a failure in CI, which has it)."""
    if binary and Path(binary).exists():
        return binary
    message = f"{what} is not installed"
    if os.environ.get("LORAPLEX_REQUIRE_SERVICES") == "1":
        pytest.fail(message)
    pytest.skip(message)


class RedisServer:
    """`redis-server` on a free port, without persistence: a restart comes back empty."""

    def __init__(self, workdir: Path):
        self.binary = require(shutil.which("redis-server"), "redis-server")
        self.workdir = workdir
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> RedisServer:
        log = open(self.workdir / f"redis-{self.port}.log", "a")  # noqa: SIM115 (the process keeps it)
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1"]
            + ["--save", "", "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        wait_for(self.answers, what=f"redis on port {self.port} answering")
        return self

    def answers(self) -> bool:
        import redis

        try:
            return bool(redis.Redis.from_url(self.url, socket_connect_timeout=0.5).ping())
        except redis.RedisError:
            return False

    def kill(self) -> None:
        """SIGKILL: the way a crashed or OOM-killed Redis goes."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class PostgresServer:
    """A throwaway cluster: `initdb` into a temporary folder, `pg_ctl` on a free port.

    PostgreSQL refuses to run as root, so the cluster belongs to the `postgres` user when
    the tests run as root; its folder is outside pytest's (root-only) temporary folders.
    """

    def __init__(self):
        self.bindir = self._bindir()
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="loraplex-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.user = "postgres" if os.geteuid() == 0 else None
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    @staticmethod
    def _bindir() -> Path:
        found = shutil.which("initdb") or next(
            iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), reverse=True)), None
        )
        return Path(require(str(found) if found else None, "PostgreSQL's initdb")).resolve().parent

    def _run(self, *args: str, timeout: float = 120) -> None:
        command = [str(self.bindir / args[0]), *args[1:]]
        if self.user:
            command = ["runuser", "-u", self.user, "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=timeout)

    def init(self) -> PostgresServer:
        if self.user:
            shutil.chown(self.root, self.user)
        os.chmod(self.root, 0o755)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        return self

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        """`-m fast`: every client connection is cut, as in a restart or a failover."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):  # not running
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
