"""A client that goes away before its stream starts gives back its concurrency slot and is metered.

The slot is taken when the request is prepared and was given back only by the stream's
body, in its `finally`. A client gone before that body started (Django cancels the view, or
the middleware it returned through, and drops the response unread) left the slot taken for
good and no usage record: a few such clients locked their tenant out with 429
`concurrency_exceeded` until the process restarted.
"""

import json
import select

import pytest

from tests.clients import chat, metric
from tests.inference.conftest import BASE_NAME, stop_server
from tests.inference.host.fault_serve import start_fault_server
from tests.processes import committed
from tests.raw_http import connect, head, read_answer
from tests.waiting import wait_for

CAP = 2  # LORAPLEX_TENANT_MAX_CONCURRENCY of this test's server


def gone_once_prepared(url: str, request: bytes) -> None:
    """Send `request` and go away once it is prepared (its slot taken) and in the engine.

    A prepared stream sends nothing before its delayed start: an answer is a refusal."""
    before = metric(url, "loraplex_prompt_tokens_total")
    with connect(url) as sock:
        sock.sendall(request)

        def in_the_engine() -> bool:
            if select.select([sock], [], [], 0)[0]:
                status, _, body = read_answer(sock)
                raise AssertionError(f"refused before the engine: {status} {body[:300]!r}")
            return metric(url, "loraplex_prompt_tokens_total") > before

        wait_for(in_the_engine, what="the request reaching the engine")


@pytest.mark.django_db  # the test database, which the server's rows live in
def test_clients_gone_before_their_stream_starts_give_back_their_slots(serve_data, tmp_path):
    from tenants.models import UsageRecord

    key = serve_data["keys"][1]  # tenant serve-b
    url, proc, log = start_fault_server(
        tmp_path,
        {
            "LORAPLEX_TENANT_MAX_CONCURRENCY": str(CAP),
            # a busy process: the first byte of a prepared stream comes long after (each
            # client below is gone well before; its going cancels the wait)
            "LORAPLEX_TEST_STREAM_START_DELAY": "600",
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
    aborted = UsageRecord.objects.filter(tenant__slug="serve-b", status=UsageRecord.ABORTED)
    try:
        for _ in range(CAP + 1):  # before: the third was a 429, both slots still taken
            gone_once_prepared(url, request + body)
        # each request's end gives its slot back, then queues its record: once metered,
        # every slot is free (before: none)
        try:
            wait_for(lambda: committed(aborted.count) == CAP + 1, what="every client metered")
        except AssertionError as missing:
            raise AssertionError(f"{missing}\n{log.read_text()}") from None
        answer = chat(url, key, model=BASE_NAME, max_tokens=2)
        assert answer.status_code == 200, answer.text  # before: 429 concurrency_exceeded
        records = committed(lambda: list(aborted))
        assert len(records) == CAP + 1
        assert all(r.prompt_tokens > 0 and r.completion_tokens == 0 for r in records)
    finally:
        stop_server(proc)
