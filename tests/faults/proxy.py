"""A TCP proxy in front of a real server (moto's S3) that makes its network fail on purpose.

Modes, switchable while connections run: `slow` (server-to-client bytes at `rate` bytes
per second), `cut` (a connection is reset once `cut_after` bytes, both directions
together, have passed: a transfer dies mid-way, as on a flaky network) and `refuse`
(new connections are reset at once). `cut_connections` bounds how many connections are
cut before the proxy passes everything again.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time


def _reset(sock: socket.socket) -> None:
    """Drop a connection at once, as when a link dies (RST where the kernel can send one).

    shutdown() first: it wakes the other pump's blocked recv(), without which close()
    would not release the socket until that recv() returned.
    """
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


class FaultProxy:
    def __init__(self, target: str):
        host, port = target.removeprefix("http://").rstrip("/").split(":")
        self.target = (host, int(port))
        self.mode = "pass"
        self.rate = 64 * 1024
        self.cut_after = 4096
        self.cut_connections: int | None = None  # None: every connection
        self.cuts = 0
        self.connections = 0
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def set(self, mode: str, **options) -> FaultProxy:
        for name, value in options.items():
            setattr(self, name, value)
        self.mode = mode
        return self

    def close(self) -> None:
        self._closed = True
        self._server.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
            if self.mode == "refuse":
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                _reset(client)
                continue
            link = _Link(self, client, upstream)
            threading.Thread(target=link.pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=link.pump, args=(upstream, client, True), daemon=True).start()

    def _should_cut(self) -> bool:
        with self._lock:
            if self.cut_connections is not None and self.cuts >= self.cut_connections:
                return False
            self.cuts += 1
            return True


class _Link:
    """One proxied connection: two pumps sharing a byte count and a fate."""

    def __init__(self, proxy: FaultProxy, client: socket.socket, upstream: socket.socket):
        self.proxy, self.client, self.upstream = proxy, client, upstream
        self.passed = 0
        self.dead = False
        self.lock = threading.Lock()

    def pump(self, source: socket.socket, sink: socket.socket, to_client: bool) -> None:
        proxy = self.proxy
        try:
            while not self.dead:
                data = source.recv(1024 if proxy.mode == "slow" else 65536)
                if not data:
                    break
                with self.lock:
                    self.passed += len(data)
                    over = proxy.mode == "cut" and self.passed > proxy.cut_after
                if over and proxy._should_cut():
                    self.kill()
                    return
                if to_client and proxy.mode == "slow":
                    time.sleep(len(data) / proxy.rate)
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            self.kill()

    def kill(self) -> None:
        self.dead = True
        _reset(self.client)
        _reset(self.upstream)
