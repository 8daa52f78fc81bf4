"""HTTP/1.1 written to a socket by hand: what an attacker sends, which an HTTP client would
not (a declared length it never sends, a chunked body past the limit, a client gone early)."""

import socket
from urllib.parse import urlsplit


def connect(url: str) -> socket.socket:
    parts = urlsplit(url)
    return socket.create_connection((parts.hostname, parts.port or 80), timeout=10)


def head(method: str, path: str, headers: dict) -> bytes:
    lines = [
        f"{method} {path} HTTP/1.1",
        "Host: 127.0.0.1",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def read_answer(sock: socket.socket) -> tuple[int, dict, bytes]:
    """The server's whole answer (it closes the connection after a refusal)."""
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:  # closed with our unread bytes: what came first stands
            break
        if not chunk:
            break
        data += chunk
    header_block, _, body = data.partition(b"\r\n\r\n")
    lines = header_block.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body
