"""Evaluations wait for an engine serving their revision: which engine answers mean "not yet"
(wait, the version pending) and which mean "never" (failed at once, saying why), the wait
bounded by the clock (LORAPLEX_EVAL_WAIT_SECONDS), and the sweep re-queueing a waiting
evaluation lost with its worker.

The engine is a stub HTTP server answering what each test queues, reached through the real
client (`score_on_engine`); the evaluation task runs eagerly in this process, so Celery does
not wait out its countdowns: `worker_clock` (tests/registry/conftest.py) moves the task's
clock by each one instead.
tests/inference/operator/test_evaluation_live.py runs a base upgrade against real engines.
"""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from registry import engines, tasks
from registry.engines import EngineCallFailed, ScoringFailed, is_refusal
from registry.models import AdapterVersion, Evaluation
from tests.processes import free_port
from tests.registry.conftest import FakeScorer, attach_eval_set, make_ready_version

Quality = AdapterVersion.Quality
NOT_YET = [None, 408, 409, 425, 429, 500, 502, 503, 504]
NEVER = [400, 401, 403, 404, 405, 413, 422]


# ---------------------------------------------------------------- the classification


@pytest.mark.parametrize("status", NOT_YET)
def test_no_answer_a_5xx_another_revision_or_busy_mean_not_yet(status):
    assert not is_refusal(EngineCallFailed("http://engine", "answer", status=status))


@pytest.mark.parametrize("status", NEVER)
def test_a_refusal_of_the_request_itself_means_never(status):
    assert is_refusal(EngineCallFailed("http://engine", "answer", status=status))


class StubEngine:
    """An engine answering `answers` in turn, the last one for ever: (status, JSON body)."""

    def __init__(self):
        self.answers: list[tuple[int, dict]] = [(503, error("engine_unavailable", "starting"))]
        self.requests: list[dict] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                stub.requests.append(
                    json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                )
                status, body = stub.answers[0] if len(stub.answers) == 1 else stub.answers.pop(0)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def error(code: str, message: str) -> dict:
    return {"error": {"code": code, "message": message}}


@pytest.fixture
def stub_engine(settings):
    stub = StubEngine()
    settings.ENGINE_URLS = [stub.url]
    yield stub
    stub.server.shutdown()
    stub.server.server_close()


ROWS = [{"prompt": "2 + 2 =", "completion": " 4"}]


@pytest.mark.parametrize("status", [s for s in NOT_YET if s is not None])
def test_the_client_says_not_yet_for_those_answers(stub_engine, status):
    stub_engine.answers = [(status, error("whatever", "not now"))]
    with pytest.raises(ScoringFailed) as caught:
        engines.score_on_engine(None, ROWS, timeout=5)
    assert caught.value.retryable and f"HTTP {status}: not now" in str(caught.value)


@pytest.mark.parametrize("status", NEVER)
def test_the_client_says_never_for_a_refusal(stub_engine, status):
    stub_engine.answers = [(status, error("invalid_request", "rows[0] is wrong"))]
    with pytest.raises(ScoringFailed) as caught:
        engines.score_on_engine(None, ROWS, timeout=5)
    assert not caught.value.retryable and "rows[0] is wrong" in caught.value.without_engines


def test_replicas_that_resolve_to_no_address_are_down_not_localhost(settings, monkeypatch):
    settings.ENGINE_URLS = ["dns+http://engine:8000"]
    monkeypatch.setattr(engines, "_resolve", lambda url: [])  # every replica restarting
    with pytest.raises(ScoringFailed) as caught:
        engines.score_on_engine(None, ROWS, timeout=5)
    assert caught.value.retryable and caught.value.failures == []
    assert "resolves to no address" in str(caught.value)


# ---------------------------------------------------------------- waiting, by the clock


def test_the_default_wait_outlasts_a_large_base_restart_a_minute_apart_at_most():
    wait = tasks.Wait(seconds=1800, longest=60)  # the documented defaults
    pauses, left = [], 1800.0
    for retries in range(wait.tries() - 1):
        pauses.append(wait.pause(retries, left))
        left -= pauses[-1]
    assert pauses[:6] == [2, 4, 8, 16, 32, 60] and max(pauses) == 60
    assert sum(pauses) == 1800 and wait.tries() == 35


def test_the_settings_default_to_thirty_minutes_a_minute_apart():
    from django.conf import settings

    assert (settings.EVAL_WAIT_SECONDS, settings.EVAL_RETRY_MAX_SECONDS) == (1800, 60)


def snapshots(monkeypatch) -> list[dict]:
    """What the version and its evaluation say after each try that met "not yet"."""
    seen: list[dict] = []
    real = tasks.evaluation_waiting

    def waiting(**kwargs):
        evaluation = real(**kwargs)
        version = AdapterVersion.objects.get(pk=evaluation.version_id)
        seen.append(
            {
                "quality": version.quality,
                "detail": version.quality_detail,
                "status": evaluation.status,
                "reason": evaluation.reason,
            }
        )
        return evaluation

    monkeypatch.setattr(tasks, "evaluation_waiting", waiting)
    return seen


@pytest.mark.django_db
def test_an_evaluation_waits_through_an_engine_restart_then_passes(
    adapter, good_adapter_dir, stub_engine, settings, worker_clock, monkeypatch
):
    attach_eval_set(adapter)
    version = make_ready_version(adapter, good_adapter_dir)
    revision = adapter.base_model.revision
    old = "cd" * 32
    fake = FakeScorer(default_ppl=9.0)
    scored = fake(version.uid, ROWS * 2)
    dead = f"http://127.0.0.1:{free_port()}"  # a replica refusing connections throughout
    settings.ENGINE_URLS = [dead, stub_engine.url]
    stub_engine.answers = [
        (503, error("engine_unavailable", "The engine is starting.")),
        (409, error("model_not_servable", f"not checked compatible with revision {old[:12]}")),
        (200, {**scored, "base_revision": old}),  # an engine answering for the old weights
        (200, scored),
    ]
    seen = snapshots(monkeypatch)
    (evaluation,) = run_queued()

    assert evaluation.status == "passed" and evaluation.attempts == 4, evaluation.reason
    assert len(stub_engine.requests) == 4 and worker_clock == [2, 4, 8]
    assert [s["quality"] for s in seen] == ["pending"] * 3
    assert {s["status"] for s in seen} == {"queued"}
    assert "HTTP 503: The engine is starting." in seen[0]["reason"]
    assert "unreachable" in seen[0]["reason"] and dead not in seen[0]["reason"]
    assert f"not checked compatible with revision {old[:12]}" in seen[1]["reason"]
    assert f"the engine serves revision {old[:12]}…, not {revision[:12]}…" in seen[2]["reason"]
    detail = seen[1]["detail"]
    assert detail.startswith(f"evaluation pending on revision {revision[:12]}…: waiting to be")
    assert "(attempt 2: " in detail and "next try in 4 s)" in detail
    version.refresh_from_db()
    assert version.quality == Quality.PASSED and version.reference_evaluation_id == evaluation.pk


@pytest.mark.django_db
def test_a_waiting_version_says_why_in_a_409(adapter, good_adapter_dir):
    from registry.errors import NotServable
    from registry.selectors import adapter_version_resolve
    from registry.services.evaluations import evaluation_waiting

    attach_eval_set(adapter)
    make_ready_version(adapter, good_adapter_dir)
    evaluation = Evaluation.objects.get()
    evaluation_waiting(evaluation_id=evaluation.pk, why="engine down", attempt=3, countdown=8)
    with pytest.raises(NotServable, match=r"waiting to be measured \(attempt 3: engine down"):
        adapter_version_resolve(tenant=adapter.tenant, adapter_name=adapter.name)


@pytest.mark.django_db
def test_an_engine_refusing_the_rows_fails_it_at_once_in_its_words(
    adapter, good_adapter_dir, stub_engine, worker_clock
):
    attach_eval_set(adapter)
    version = make_ready_version(adapter, good_adapter_dir)
    message = "rows[1] is 900 + 3 tokens; this model scores at most 511"
    stub_engine.answers = [(400, error("context_length_exceeded", message))]
    (evaluation,) = run_queued()
    assert evaluation.status == "failed" and evaluation.attempts == 1 and worker_clock == []
    assert "the engine refused the eval set" in evaluation.reason and message in evaluation.reason
    assert stub_engine.url not in evaluation.reason
    version.refresh_from_db()
    assert version.quality == Quality.FAILED and version.quality_detail == evaluation.reason


@pytest.mark.django_db
def test_the_wait_is_counted_from_the_first_try_and_then_fails_saying_so(
    adapter, good_adapter_dir, stub_engine, settings, worker_clock
):
    settings.EVAL_WAIT_SECONDS, settings.EVAL_RETRY_MAX_SECONDS = 300, 60
    attach_eval_set(adapter)
    version = make_ready_version(adapter, good_adapter_dir)
    stub_engine.answers = [(503, error("engine_unavailable", "The engine is starting."))]
    (evaluation,) = run_queued()
    tries = tasks.Wait(seconds=300, longest=60).tries()
    assert worker_clock == [2, 4, 8, 16, 32, 60, 60, 60, 58] and tries == 10
    assert evaluation.status == "failed" and evaluation.attempts == tries
    assert "nothing could measure it within 5 min (LORAPLEX_EVAL_WAIT_SECONDS)" in evaluation.reason
    assert "after 10 attempts; the last: " in evaluation.reason
    assert "HTTP 503: The engine is starting." in evaluation.reason
    version.refresh_from_db()
    assert version.quality == Quality.FAILED


def run_queued() -> list[Evaluation]:
    from tests.registry.conftest import run_evaluations

    return run_evaluations()


# ---------------------------------------------------------------- a worker lost while waiting


@pytest.mark.django_db
def test_a_waiting_evaluation_lost_with_its_worker_is_requeued_then_passes(
    adapter, good_adapter_dir, settings, monkeypatch, scorer
):
    """Waiting, it has tried more often than any delivery of a validation may: the sweep
    re-queues it all the same, and gives up only after its deliveries' worth of tries."""
    from datetime import timedelta

    from django.utils import timezone

    from registry import queue

    sent = []
    monkeypatch.setattr(queue, "send_on_commit", lambda *args: sent.append(args))
    attach_eval_set(adapter)
    version = make_ready_version(adapter, good_adapter_dir)
    evaluation = Evaluation.objects.get()
    silent = timezone.now() - timedelta(seconds=settings.VALIDATION_DEADLINE_SECONDS + 1)
    Evaluation.objects.filter(pk=evaluation.pk).update(
        status="queued", attempts=30, started_at=silent, reason="waiting to be measured: ..."
    )
    sent.clear()
    assert tasks.sweep_stuck_evaluations() == {"requeued": 1, "failed": 0}
    assert sent == [(queue.EVALUATE, evaluation.pk)]
    (evaluation,) = run_queued()
    assert evaluation.status == "passed" and evaluation.attempts == 31

    most = settings.VALIDATION_MAX_ATTEMPTS * tasks.evaluation_wait().tries()
    again = version.evaluations.create(
        eval_set=evaluation.eval_set,
        base_revision=evaluation.base_revision,
        trigger="rerun",
        requested_by="test",
        status="running",
        attempts=most,
        started_at=silent,
    )
    assert tasks.sweep_stuck_evaluations() == {"requeued": 0, "failed": 1}
    again.refresh_from_db()
    assert again.status == "failed" and f"started {most} times" in again.reason
