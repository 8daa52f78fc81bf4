"""Each part of an upload is held to its own limit in front of Django, as the body arrives
(platform_site/body_limits.py with registry/body_limits.py's table), and every 413 names
its part.

Before, a version upload's `eval` part over LORAPLEX_EVAL_MAX_BYTES was refused only after
the whole body (up to the weights' limit) had been read and spilled to disk, and the eval
set PUT's 413 had `param: null`. These tests drive the served ASGI application itself
(platform_site.asgi.application) with a body the app pulls one chunk at a time: a refusal
that comes while chunks are still unsent came before the rest of the body was read.
"""

import asyncio
import hashlib
import json

import httpx
import pytest
from asgiref.sync import async_to_sync
from django.core import signals
from django.db import close_old_connections

from platform_site.asgi import application
from registry.models import AdapterVersion
from tenants.scopes import REGISTRY_READ, REGISTRY_WRITE
from tests.registry.conftest import stored_objects

pytestmark = pytest.mark.django_db

VERSIONS = "/api/v1/adapters/support-bot/versions/"
EVAL_SET = "/api/v1/adapters/support-bot/eval-set/"
CHUNK = 16 * 1024


def multipart(files: dict[str, bytes], data: dict[str, str] | None = None) -> tuple[str, bytes]:
    """(Content-Type, body) as an HTTP client (httpx) writes them."""
    request = httpx.Request(
        "POST", "http://x/", files={k: (f"{k}.bin", v) for k, v in files.items()}, data=data
    )
    return request.headers["content-type"], request.read()


class Exchange:
    """One request through the ASGI app; the app pulls the body a chunk at a time."""

    def __init__(self, method: str, path: str, headers: dict[str, str], body: bytes):
        self.scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
            "client": ("127.0.0.1", 5000),
            "server": ("testserver", 80),
        }
        self.chunks = [body[i : i + CHUNK] for i in range(0, len(body), CHUNK)] or [b""]
        self.pulled = 0
        self.status: int | None = None
        self.body = b""

    async def run(self) -> None:
        answered = asyncio.Event()

        async def receive():
            if self.pulled < len(self.chunks):
                self.pulled += 1
                more = self.pulled < len(self.chunks)
                return {
                    "type": "http.request",
                    "body": self.chunks[self.pulled - 1],
                    "more_body": more,
                }
            await answered.wait()  # the whole body was read: the client waits for the answer
            return {"type": "http.disconnect"}

        async def send(message):
            if message["type"] == "http.response.start":
                self.status = message["status"]
            elif message["type"] == "http.response.body":
                self.body += message.get("body", b"")
                if not message.get("more_body"):
                    answered.set()

        await asyncio.wait_for(application(self.scope, receive, send), timeout=120)

    @property
    def error(self) -> dict:
        return json.loads(self.body)["error"]


def run(exchange: Exchange) -> Exchange:
    """As Django's test client does: the request keeps the test's database connection."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        async_to_sync(exchange.run)()
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)
    return exchange


def send(method: str, path: str, body: bytes, content_type: str, key: str | None = None):
    headers = {"content-type": content_type, "content-length": str(len(body))}
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    return run(Exchange(method, path, headers, body))


@pytest.fixture
def writer(adapter, make_key):
    return make_key(adapter.tenant, scopes=[REGISTRY_READ, REGISTRY_WRITE])[1]


@pytest.fixture
def small_limits(settings):
    settings.EVAL_MAX_BYTES = 64 * 1024
    settings.MAX_ADAPTER_BYTES = 4 * 1024 * 1024
    return settings


def adapter_files(folder) -> dict[str, bytes]:
    return {
        "config": (folder / "adapter_config.json").read_bytes(),
        "weights": (folder / "adapter_model.safetensors").read_bytes(),
    }


@pytest.mark.parametrize("part", ["eval", "config", "weights"])
def test_a_part_over_its_limit_is_refused_while_the_body_is_still_arriving(
    small_limits, good_adapter_dir, part
):
    """No key needed: the refusal comes before Django reads the body, so before any view."""
    limit = {"eval": 64 * 1024, "config": 1024 * 1024, "weights": 4 * 1024 * 1024}[part]
    files = adapter_files(good_adapter_dir) | {"eval": b"{}\n"}
    files[part] = b"x" * (limit + 1)
    # the oversized part first, then half a megabyte after it that must never be read (the
    # whole body within the upload's limit, so not refused from its Content-Length)
    ordered = {part: files.pop(part), **files, "padding": b"p" * (512 * 1024)}
    content_type, body = multipart(ordered)
    exchange = send("POST", VERSIONS, body, content_type)
    assert exchange.status == 413, exchange.body
    assert exchange.error["code"] == "upload_too_large"
    assert exchange.error["param"] == part
    assert str(limit) in exchange.error["message"]
    # refused within a chunk of the limit: the rest of the body was never pulled
    assert exchange.pulled * CHUNK <= limit + 2 * CHUNK < len(body)
    assert not AdapterVersion.objects.exists() and stored_objects() == []


def test_an_eval_set_put_over_its_limit_names_its_part(small_limits, writer):
    content_type, body = multipart({"file": b"{}\n" * (40 * 1024)})  # 120 KiB > 64 KiB
    exchange = send("PUT", EVAL_SET, body, content_type, writer)
    assert exchange.status == 413
    assert exchange.error["code"] == "upload_too_large" and exchange.error["param"] == "file"
    assert exchange.pulled < len(exchange.chunks)


def test_an_eval_set_put_declared_too_large_names_its_part(small_limits):
    """Refused from Content-Length, unread: the body's one part is at fault."""
    headers = {"content-type": "multipart/form-data; boundary=x", "content-length": str(10**9)}
    exchange = run(Exchange("PUT", EVAL_SET, headers, b""))
    assert exchange.status == 413 and exchange.pulled == 0
    assert exchange.error["param"] == "file"


def test_form_fields_over_the_request_limit_are_refused_as_they_arrive(settings, good_adapter_dir):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 32 * 1024
    content_type, body = multipart(
        adapter_files(good_adapter_dir), data={"source": "s" * (200 * 1024)}
    )
    exchange = send("POST", VERSIONS, body, content_type)
    assert exchange.status == 413
    assert exchange.error["code"] == "request_too_large" and exchange.error["param"] == "source"
    assert exchange.pulled < len(exchange.chunks)


def test_a_normal_upload_reaches_django_byte_for_byte(small_limits, good_adapter_dir, writer):
    files = adapter_files(good_adapter_dir) | {"eval": b'{"prompt": "a", "completion": "b"}\n'}
    content_type, body = multipart(files)
    exchange = send("POST", VERSIONS, body, content_type, writer)
    assert exchange.status == 202, exchange.body
    assert exchange.pulled == len(exchange.chunks)
    version = AdapterVersion.objects.get()
    assert version.weights_sha256 == hashlib.sha256(files["weights"]).hexdigest()
    assert version.config_sha256 == hashlib.sha256(files["config"]).hexdigest()
    assert version.weights_size == len(files["weights"])


def test_parts_at_exactly_their_limits_pass(settings, good_adapter_dir, writer):
    files = adapter_files(good_adapter_dir)
    settings.MAX_ADAPTER_BYTES = len(files["weights"])
    settings.EVAL_MAX_BYTES = 36
    files["eval"] = b'{"prompt": "a", "completion": "bc"}\n'
    assert len(files["eval"]) == settings.EVAL_MAX_BYTES
    content_type, body = multipart(files)
    exchange = send("POST", VERSIONS, body, content_type, writer)
    assert exchange.status == 202, exchange.body


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("multipart/form-data", b"--x\r\n\r\n"),  # no boundary
        ("multipart/form-data; boundary=" + "b" * 300, b"--b\r\n"),  # one Django refuses
        ("multipart/form-data; boundary=zz", b"no delimiter at all " * 500),
        ("multipart/form-data; boundary=zz", b"--zz\r\n" + b"h" * 5000 + b"\r\n\r\nx\r\n--zz--"),
        ("multipart/form-data; boundary=zz", b"--zz\r\nContent-Disposition: form-data; name="),
        (
            "multipart/form-data; boundary=zz",
            b'--zz\r\nContent-Disposition: form-data; name="weights"; filename="w"\r\n\r\nab',
        ),
    ],
    ids=["no-boundary", "bad-boundary", "no-delimiter", "long-headers", "cut-header", "unclosed"],
)
def test_malformed_multipart_is_a_clear_4xx(writer, content_type, body):
    exchange = send("POST", VERSIONS, body, content_type, writer)
    assert 400 <= (exchange.status or 0) < 500, exchange.body
    assert exchange.error["message"]
    assert not AdapterVersion.objects.exists()
