"""A client that goes away before its stream starts gives back its concurrency slot and is metered.

The slot is taken when the request is prepared and was given back only by the stream's
body, in its `finally`. A client gone before that body started (Django cancels the view, or
the middleware it returned through, and drops the response unread) left the slot taken for
good and no usage record: a few such clients locked their tenant out with 429
`concurrency_exceeded` until the process restarted.
"""

import json
import time

import httpx
import pytest

from tests.inference.conftest import BASE_NAME, stop_server
from tests.inference.fault_serve import start_fault_server
from tests.inference.test_bodies import connect, head

CAP = 2  # LORAPLEX_TENANT_MAX_CONCURRENCY of this test's server


@pytest.mark.django_db  # the test database, which the server's rows live in
def test_clients_gone_before_their_stream_starts_give_back_their_slots(serve_data, tmp_path):
    from tenants.models import UsageRecord

    key = serve_data["keys"][1]  # tenant serve-b
    url, proc, log = start_fault_server(
        tmp_path,
        {
            "LORAPLEX_TENANT_MAX_CONCURRENCY": str(CAP),
            # a busy process: the first byte of a prepared stream comes 2 s later
            "LORAPLEX_TEST_STREAM_START_DELAY": "2",
        },
    )
    body = json.dumps(
        {
            "model": BASE_NAME,
            "messages": [{"role": "user", "content": "Hello there"}],
            "max_tokens": 4,
            "stream": True,
        }
    ).encode()
    request = head(
        "POST",
        "/v1/chat/completions",
        {
            "Authorization": f"Bearer {key}",
            "Content-Type": "application/json",
            "Content-Length": len(body),
        },
    )
    try:
        for _ in range(CAP + 1):
            with connect(url) as sock:
                sock.sendall(request + body)
                time.sleep(1)  # prepared, its slot taken; then the client is gone
        answer = httpx.post(
            f"{url}/v1/chat/completions",
            json={
                "model": BASE_NAME,
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 2,
            },
            headers={"Authorization": f"Bearer {key}"},
            timeout=60,
        )
        assert answer.status_code == 200, answer.text  # before: 429 concurrency_exceeded
        aborted = UsageRecord.objects.filter(tenant__slug="serve-b", status=UsageRecord.ABORTED)
        deadline = time.monotonic() + 15  # the usage writer stores records every second
        while aborted.count() < CAP + 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert aborted.count() == CAP + 1, log.read_text()  # before: none
        assert all(r.prompt_tokens > 0 and r.completion_tokens == 0 for r in aborted)
    finally:
        stop_server(proc)
