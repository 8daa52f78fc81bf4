"""HAProxy on loopback in front of `serve` replicas, running the shipped docker/haproxy.cfg.

The compose file's `server-template` (replicas found through Docker's DNS) becomes one
`server` line per loopback replica; every other directive is the shipped one, so the tests
check the routing operators run. `balance` can be swapped (the benchmark's round robin).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import httpx

from tests.faults.services import require
from tests.inference.conftest import stop_server
from tests.processes import ROOT, free_port

SHIPPED_CONFIG = ROOT / "docker" / "haproxy.cfg"
CHECK_INTERVAL_SECONDS = 1.0  # the tests' health-check interval (compose: 2 s)


def render_config(
    servers: dict[str, str],
    *,
    balance: str | None = None,
    pools: dict[str, dict[str, str]] | None = None,
) -> str:
    """The shipped config with `servers` (name -> host:port) in place of the template, and
    for each further base model in `pools` (base model -> its servers) a copy of the
    shipped `backend engines` named base_<base model>, as an operator adds one."""
    lines = []
    for line in SHIPPED_CONFIG.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("server-template "):
            lines += [f"    server {name} {address}" for name, address in servers.items()]
            continue
        if stripped.startswith("default-server "):
            line = line.replace("inter 2s", f"inter {int(CHECK_INTERVAL_SECONDS * 1000)}ms")
        if balance is not None and stripped.startswith("balance "):
            line = f"    balance {balance}"
        lines.append(line)
    text = "\n".join(lines) + "\n"
    engines = text[text.index("\nbackend engines\n") :]  # the last section of the file
    for base, pool in (pools or {}).items():
        copy = engines.replace("\nbackend engines\n", f"\nbackend base_{base}\n")
        own = "".join(f"    server {name} {address}\n" for name, address in pool.items())
        text += re.sub(r"(?m)^    server .*\n", "", copy).rstrip("\n") + "\n" + own
    return text


class Router:
    """`haproxy` with the rendered config; `url` is its frontend."""

    def __init__(
        self,
        workdir: Path,
        servers: dict[str, str],
        *,
        balance: str | None = None,
        pools: dict[str, dict[str, str]] | None = None,
    ):
        self.binary = require(shutil.which("haproxy"), "haproxy (Debian's package)")
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = workdir / f"haproxy-{self.port}.cfg"
        self.config.write_text(render_config(servers, balance=balance, pools=pools))
        self.socket = workdir / f"haproxy-{self.port}.sock"
        self.log = workdir / f"haproxy-{self.port}.log"
        self.servers = {
            **servers,
            **{n: a for pool in (pools or {}).values() for n, a in pool.items()},
        }
        self.proc: subprocess.Popen | None = None

    def start(self, *, timeout: float = 30) -> Router:
        env = {
            **os.environ,
            "HAPROXY_BIND": f"127.0.0.1:{self.port}",
            "HAPROXY_SOCKET": str(self.socket),
        }
        check = subprocess.run(
            [self.binary, "-c", "-f", str(self.config)], env=env, capture_output=True, text=True
        )
        if check.returncode != 0:
            raise RuntimeError(f"haproxy refused its config:\n{check.stdout}{check.stderr}")
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                [self.binary, "-db", "-f", str(self.config)],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.wait_servers_up(len(self.servers), timeout=timeout)
        return self

    def server_rows(self) -> list[dict[str, str]]:
        """Each server's row of the runtime API's `show stat` (status, scur, ...)."""
        import socket

        if not self.socket.exists():
            return []
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(self.socket))
            s.sendall(b"show stat\n")
            raw = b""
            while chunk := s.recv(65536):
                raw += chunk
        rows = raw.decode().splitlines()
        header = rows[0].lstrip("# ").split(",")
        fields = [dict(zip(header, row.split(","), strict=False)) for row in rows[1:]]
        return [f for f in fields if f.get("svname") not in ("FRONTEND", "BACKEND", None)]

    def servers_up(self) -> int:
        """Servers the health checks see up."""
        return sum(row.get("status", "").startswith("UP") for row in self.server_rows())

    def sessions(self) -> int:
        """Requests the servers hold now: the bounded loads count them, so a test that needs
        the hash's first choice waits for none before its next request."""
        return sum(int(row.get("scur") or 0) for row in self.server_rows())

    def wait_servers_up(self, count: int, *, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.servers_up() != count:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"haproxy exited:\n{self.log.read_text()}")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"haproxy does not see {count} servers up:\n{self.log.read_text()}"
                )
            time.sleep(0.2)

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.url + path, timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            stop_server(self.proc)
