"""Request bodies are bounded before Django reads them (platform_site/body_limits.py).

Before, Django's ASGI handler read every body whole (to a temporary file past 2.5 MB) before
any check ran, and uvicorn has no limit: `POST /healthz` without credentials took hundreds
of megabytes, a chunked body skipped the Content-Length check, and a body that stopped
arriving held its request open forever. Raw sockets here, since an HTTP client would not
send what an attacker sends.
"""

import json
import select
import time
from pathlib import Path

import httpx
import pytest

from tests.inference.conftest import start_server, stop_server
from tests.peft_adapters import make_peft_adapter
from tests.raw_http import connect, head, read_answer
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db  # the test database, which the server's rows live in

LIMIT = 256 * 1024  # LORAPLEX_MAX_REQUEST_BYTES of this module's server
TIMEOUT = 1  # LORAPLEX_BODY_TIMEOUT_SECONDS of this module's server
CONNECTIONS = 4  # LORAPLEX_MAX_CONNECTIONS of this module's server


@pytest.fixture(scope="module")
def server(serve_data):
    url, proc, log = start_server(
        serve_data["tmp"],
        {
            "LORAPLEX_MAX_REQUEST_BYTES": str(LIMIT),
            "LORAPLEX_BODY_TIMEOUT_SECONDS": str(TIMEOUT),
            "LORAPLEX_MAX_CONNECTIONS": str(CONNECTIONS),
        },
    )
    yield url, proc, log
    stop_server(proc)


def bytes_written(pid: int) -> int:
    """What the process has written to files (disk, pipes), not to sockets."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError("no wchar in /proc/<pid>/io")


@pytest.mark.parametrize(
    ("path", "content_type", "code"),
    [
        ("/healthz", "application/json", "request_too_large"),
        ("/v1/chat/completions", "application/json", "request_too_large"),
        ("/api/v1/adapters/pirate/versions/", "application/json", "request_too_large"),
        (
            "/api/v1/adapters/pirate/versions/",
            "multipart/form-data; boundary=x",
            "upload_too_large",
        ),
    ],
)
def test_a_declared_length_over_the_limit_is_refused_before_the_body_is_sent(
    server, path, content_type, code
):
    url, _, _ = server
    with connect(url) as sock:
        sock.sendall(head("POST", path, {"Content-Type": content_type, "Content-Length": 10**12}))
        status, headers, body = read_answer(sock)  # before: waits for a terabyte
    assert status == 413
    assert headers["connection"] == "close"
    error = json.loads(body)["error"]
    assert error["code"] == code and error["type"] == "invalid_request_error"


def test_a_chunked_body_is_cut_at_the_limit_and_never_written_to_disk(server):
    url, proc, _ = server
    written = bytes_written(proc.pid)
    chunk = b"x" * 65536
    sent = 0
    with connect(url) as sock:
        sock.sendall(head("POST", "/healthz", {"Transfer-Encoding": "chunked"}))
        while sent < 5 * 1024 * 1024:
            try:
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(chunk)
            if select.select([sock], [], [], 0)[0]:
                break  # the answer is there: stop sending
        status, _, body = read_answer(sock)
    assert status == 413, body  # before: the 5 MB were read (and spilled to disk), then a 405
    assert json.loads(body)["error"]["code"] == "request_too_large"
    assert bytes_written(proc.pid) - written < LIMIT


def test_a_stalled_body_is_cut_after_the_timeout(server):
    url, _, _ = server
    with connect(url) as sock:
        sock.sendall(head("POST", "/v1/chat/completions", {"Content-Length": 1000}) + b"{")
        started = time.monotonic()
        status, headers, body = read_answer(sock)  # before: waited for ever
    assert status == 408
    assert headers["connection"] == "close"
    assert json.loads(body)["error"]["code"] == "request_timeout"
    assert TIMEOUT <= time.monotonic() - started < TIMEOUT + 5


def test_connections_beyond_the_limit_are_503(server):
    url, _, _ = server
    held = [connect(url) for _ in range(CONNECTIONS - 1)]
    try:  # refused once the server has accepted the held ones (before: no limit at all)
        wait_for(lambda: healthz(url) == 503, what="the connection past the limit refused")
    finally:
        for sock in held:
            sock.close()
    wait_for(lambda: healthz(url) == 200, what="the closed connections no longer counted")


def healthz(url: str) -> int:
    return httpx.get(f"{url}/healthz", timeout=60).status_code


@pytest.fixture(scope="module")
def writer_key(serve_data, django_db_blocker):
    from tenants.models import Tenant
    from tenants.services import api_key_create

    with django_db_blocker.unblock():
        _, key = api_key_create(
            tenant=Tenant.objects.get(slug="serve-a"),
            name="uploads",
            scopes=["registry:read", "registry:write"],
        )
    return key


def test_an_upload_above_the_request_limit_still_goes_through(server, serve_data, writer_key):
    url, _, _ = server
    adapter_dir = make_peft_adapter(
        serve_data["base_dir"],
        serve_data["tmp"] / "big-adapter",
        rank=64,
        targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        base_model_name="tiny-serve",
    )
    weights = (adapter_dir / "adapter_model.safetensors").read_bytes()
    assert len(weights) > LIMIT  # only the upload route may take this much
    auth = {"Authorization": f"Bearer {writer_key}"}
    created = httpx.post(f"{url}/api/v1/adapters/", json={"name": "big-upload"}, headers=auth)
    assert created.status_code == 201, created.text
    versions = f"{url}/api/v1/adapters/big-upload/versions/"
    uploaded = httpx.post(
        versions,
        headers=auth,
        files={
            "config": ("adapter_config.json", (adapter_dir / "adapter_config.json").read_bytes()),
            "weights": ("adapter_model.safetensors", weights),
        },
        timeout=60,
    )
    assert uploaded.status_code == 202, uploaded.text
    # the same bytes, not as the multipart upload: the small limit
    raw = httpx.post(
        versions, headers={**auth, "Content-Type": "application/octet-stream"}, content=weights
    )
    assert raw.status_code == 413
    assert raw.json()["error"]["code"] == "request_too_large"


def test_a_form_field_over_the_request_limit_is_413_not_a_500(server, writer_key):
    """The upload route takes big files, but its other fields keep the small limit: Django's
    RequestDataTooBig, raised inside DRF's parser, was a 500 `internal_error`."""
    url, _, _ = server
    response = httpx.post(
        f"{url}/api/v1/adapters/pirate/versions/",
        headers={"Authorization": f"Bearer {writer_key}"},
        data={"source": "x" * (LIMIT + 1)},
        files={"config": ("adapter_config.json", b"{}")},
    )
    assert response.status_code == 413, response.text
    assert response.json()["error"]["code"] == "request_too_large"


def test_an_oversized_eval_part_is_refused_while_the_body_is_still_being_sent(server):
    """Before, an upload's `eval` part over LORAPLEX_EVAL_MAX_BYTES (1 MiB here) was refused
    only once the whole declared body had arrived (and been spilled to disk): this client
    would have sent its 8 MiB and still waited. Now the answer comes as the part passes its
    limit, naming it, while most of the body is unsent."""
    url, proc, _ = server
    boundary = "loraplex-part-limits"
    part_head = (
        f"--{boundary}\r\n"
        'Content-Disposition: form-data; name="eval"; filename="eval.jsonl"\r\n\r\n'
    ).encode()
    declared = 64 * 1024 * 1024  # within the upload's whole-body limit; never sent whole
    written = bytes_written(proc.pid)
    sent = 0
    with connect(url) as sock:
        headers = {
            "Content-Type": f"multipart/form-data; boundary={boundary}",
            "Content-Length": declared,
        }
        sock.sendall(head("POST", "/api/v1/adapters/pirate/versions/", headers) + part_head)
        chunk = b"e" * 65536
        while not select.select([sock], [], [], 0)[0]:  # until the answer is there
            assert sent < 8 * 1024 * 1024, "no answer after 8 MiB of a part limited to 1 MiB"
            try:
                sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break  # refused and closed: the answer is waiting
            sent += len(chunk)
        status, _, body = read_answer(sock)
    assert status == 413, body
    error = json.loads(body)["error"]
    assert error["code"] == "upload_too_large" and error["param"] == "eval"
    assert sent < declared // 8
    assert bytes_written(proc.pid) - written < 2 * 1024 * 1024
