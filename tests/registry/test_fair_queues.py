"""Background work is fair between tenants, with real workers started as `make run` starts
them (scripts/run-embedded.sh) and a stub engine that holds each scoring request until the
test lets it answer: an evaluation that runs as long as the test wants.

- Another tenant's upload is validated while an evaluation scores (the queues are apart).
- A tenant's second evaluation waits for its first; another tenant's runs meanwhile.
- Deleting an adapter (force) stops its evaluation between two scoring requests.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import shlex
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from registry.models import AdapterVersion, BaseModel, Evaluation
from registry.services.adapters import adapter_create, adapter_delete
from registry.services.eval_sets import eval_set_attach
from registry.services.evaluations import SCORE_CHUNK_ROWS
from tests.adapter_versions import create_version
from tests.faults.workers import stop
from tests.processes import ROOT, database_url
from tests.waiting import wait_for

SCRIPT = ROOT / "scripts" / "run-embedded.sh"


class HoldingEngine:
    """Answers POST /v1/internal/score as an engine would, once `release` is set: until then
    each request waits, as a long scoring does. `requests` holds each body, as it arrives."""

    def __init__(self, revision: str):
        self.revision = revision
        self.release = threading.Event()
        self.requests: list[dict] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.requests.append(body)
                stub.release.wait(timeout=300)
                data = json.dumps(stub.answer(body)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, body: dict) -> dict:
        rows = body["rows"]
        totals = {"tokens": 4 * len(rows), "nll": 1.0, "perplexity": math.e}
        return {
            "adapter_version": body["adapter_version"],
            "base_revision": self.revision,
            "rows": [{"tokens": 4, "adapter_nll": 4.0, "base_nll": 4.0} for _ in rows],
            "adapter": totals,
            "base": totals,
        }

    def versions_asked(self) -> list[str]:
        return [body["adapter_version"] for body in list(self.requests)]

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def make_run_workers() -> list[list[str]]:
    """The arguments of each `celery worker` scripts/run-embedded.sh starts, without beat and
    its node name: the queues, pools and concurrency `make run` uses."""
    text = SCRIPT.read_text().replace("\\\n", " ")
    found = re.findall(r'"\$VENV/bin/celery" -A platform_site worker (.+?) &$', text, re.M)
    assert len(found) >= 2, found  # evaluations in a worker of their own
    workers = []
    for line in found:
        args = shlex.split(line)
        name = args.index("-n")
        del args[name : name + 2]
        workers.append([a for a in args if a != "-B"])
    return workers


def start_worker(log: Path, args: list[str]) -> subprocess.Popen:
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "platform_site", "worker", *args]
            + ["--without-heartbeat", "--without-gossip", "--without-mingle"]
            + ["-n", f"{log.stem}-{os.getpid()}@%h"],
            cwd=ROOT,
            env={**os.environ, "DATABASE_URL": database_url()},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    wait_for(
        lambda: " ready." in log.read_text() or proc.poll() is not None,
        what=f"worker {log.stem} to start",
    )
    assert proc.poll() is None, log.read_text()
    return proc


@pytest.fixture
def engine(s3, base_model, settings, monkeypatch):
    revision = BaseModel.objects.get(pk=base_model.pk).revision
    stub = HoldingEngine(revision)
    monkeypatch.setenv("LORAPLEX_ENGINE_URLS", stub.url)
    settings.ENGINE_URLS = [stub.url]
    yield stub
    stub.close()


@pytest.fixture
def workers(engine, transactional_db, tmp_path):
    """The workers `make run` starts, on the test's bucket, database and stub engine: their
    logs, by the queues each consumes."""
    started, logs = [], {}
    try:
        for args in make_run_workers():
            queues = args[args.index("-Q") + 1]
            log = tmp_path / f"worker-{queues.replace(',', '-')}.log"
            started.append(start_worker(log, args))
            logs[queues] = log
        yield logs
    finally:
        engine.release.set()  # a held request must not keep a worker from stopping
        for proc in started:
            stop(proc)


def eval_rows(count: int) -> bytes:
    rows = [{"prompt": f"{i} + {i} =", "completion": f" {2 * i}"} for i in range(count)]
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def with_eval_set(tenant, name: str, rows: int):
    adapter = adapter_create(tenant=tenant, name=name, actor="test")
    eval_set_attach(adapter=adapter, file=io.BytesIO(eval_rows(rows)), actor="test")
    return adapter


def status_of(version: AdapterVersion) -> str:
    return AdapterVersion.objects.values_list("status", flat=True).get(pk=version.pk)


def evaluations_of(version: AdapterVersion) -> list[str]:
    return list(Evaluation.objects.filter(version=version).values_list("status", flat=True))


def test_another_tenants_upload_is_validated_while_an_evaluation_scores(
    workers, engine, tenant_a, tenant_b, good_adapter_dir, second_adapter_dir
):
    long_one = create_version(with_eval_set(tenant_a, "long-eval", 2), good_adapter_dir)
    wait_for(lambda: engine.requests, what="the evaluation's scoring request")
    assert evaluations_of(long_one) == ["running"]

    other = create_version(
        adapter_create(tenant=tenant_b, name="other", actor="test"), second_adapter_dir
    )
    assert status_of(other) == "pending"
    validating = ("pending", "validating")
    wait_for(lambda: status_of(other) not in validating, what="the other tenant's validation")
    assert status_of(other) == "ready"
    # ...while the evaluation was still scoring: its request has not been answered.
    assert not engine.release.is_set() and evaluations_of(long_one) == ["running"]

    engine.release.set()
    wait_for(lambda: evaluations_of(long_one) == ["passed"], what="the evaluation's verdict")


def test_a_tenants_second_evaluation_waits_for_its_first_and_another_tenant_goes_first(
    workers, engine, tenant_a, tenant_b, good_adapter_dir, second_adapter_dir
):
    first = create_version(with_eval_set(tenant_a, "first", 2), good_adapter_dir)
    wait_for(lambda: engine.requests, what="the first evaluation's scoring request")
    second = create_version(with_eval_set(tenant_a, "second", 2), second_adapter_dir)
    wait_for(lambda: evaluations_of(second) == ["queued"], what="the second evaluation, queued")
    other = create_version(with_eval_set(tenant_b, "other", 2), good_adapter_dir)

    # A free slot goes to the other tenant; tenant A's second waits though it came first.
    wait_for(lambda: str(other.uid) in engine.versions_asked(), what="the other tenant's turn")
    assert str(second.uid) not in engine.versions_asked()
    assert evaluations_of(first) == ["running"] and evaluations_of(second) == ["queued"]
    log = workers["evaluation"].read_text()
    assert f"waits for its tenant's evaluation {Evaluation.objects.get(version=first).pk}" in log

    engine.release.set()
    for version in (first, second, other):
        wait_for(lambda v=version: evaluations_of(v) == ["passed"], what=f"{version}'s verdict")
    asked = engine.versions_asked()
    assert asked.index(str(second.uid)) > asked.index(str(other.uid))


def test_deleting_the_adapter_stops_its_evaluation_between_requests(
    workers, engine, tenant_a, good_adapter_dir
):
    rows = 3 * SCORE_CHUNK_ROWS  # three scoring requests
    adapter = with_eval_set(tenant_a, "doomed", rows)
    create_version(adapter, good_adapter_dir)
    wait_for(lambda: engine.requests, what="the first scoring request")
    assert len(engine.requests[0]["rows"]) == SCORE_CHUNK_ROWS

    adapter_delete(adapter=adapter, actor="test", force=True)
    assert not Evaluation.objects.exists()  # gone with its version
    engine.release.set()  # the request in flight answers; nothing more is asked

    log = workers["evaluation"]
    wait_for(
        lambda: re.search(
            r"evaluate_adapter_version\[.+\] succeeded in .+: 'cancelled'", log.read_text()
        ),
        what="the evaluation's task to end cancelled",
    )
    assert "evaluation stopped: its version was deleted" in log.read_text()
    assert len(engine.requests) == 1
