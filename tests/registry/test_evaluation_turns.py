"""Evaluations in this process (the worker's task run eagerly, the engine's scoring call
replaced by `scorer`): a tenant's evaluation waits while another of its own runs, and one
superseded while it scores stops before its next request. test_fair_queues.py runs the same
with real workers."""

from datetime import timedelta

import pytest
from django.utils import timezone

from registry.models import AdapterVersion, Evaluation
from registry.services import evaluations
from registry.services.adapters import adapter_create
from registry.services.evaluation_turns import NotItsTurn
from registry.services.evaluations import SCORE_CHUNK_ROWS, evaluation_run
from registry.tasks import evaluate_adapter_version
from tests.registry.conftest import ALICE_ACTOR, attach_eval_set, make_ready_version

pytestmark = pytest.mark.django_db
Quality = AdapterVersion.Quality


def rows(count: int) -> list[dict]:
    return [{"prompt": f"{i} + 1 =", "completion": f" {i + 1}"} for i in range(count)]


def queued_evaluation(adapter, folder) -> Evaluation:
    version = make_ready_version(adapter, folder)
    return Evaluation.objects.get(version=version, status="queued")


def test_a_tenants_evaluation_waits_while_another_of_its_own_runs(
    tenant_a, tenant_b, adapter, base_model, good_adapter_dir, second_adapter_dir, scorer
):
    attach_eval_set(adapter)
    first = queued_evaluation(adapter, good_adapter_dir)
    second = queued_evaluation(adapter, second_adapter_dir)
    Evaluation.objects.filter(pk=first.pk).update(status="running", started_at=timezone.now())

    with pytest.raises(NotItsTurn, match=f"its tenant's evaluation {first.pk} to end"):
        evaluation_run(evaluation_id=second.pk)
    second.refresh_from_db()
    assert second.status == "queued" and second.attempts == 0 and scorer.calls == []
    assert second.started_at is not None  # its message is alive: the sweep leaves it alone

    # another tenant's evaluation runs meanwhile
    other = adapter_create(tenant=tenant_b, name="other-bot", actor=ALICE_ACTOR)
    attach_eval_set(other)
    theirs = queued_evaluation(other, good_adapter_dir)
    assert evaluation_run(evaluation_id=theirs.pk).status == "passed"


def test_a_running_evaluation_whose_worker_died_does_not_hold_the_turn(
    adapter, base_model, good_adapter_dir, second_adapter_dir, scorer, settings
):
    attach_eval_set(adapter)
    lost = queued_evaluation(adapter, good_adapter_dir)
    second = queued_evaluation(adapter, second_adapter_dir)
    long_ago = timezone.now() - timedelta(seconds=settings.VALIDATION_DEADLINE_SECONDS + 1)
    Evaluation.objects.filter(pk=lost.pk).update(status="running", started_at=long_ago)
    assert evaluation_run(evaluation_id=second.pk).status == "passed"


def test_a_version_superseded_while_scoring_stops_before_the_next_request(
    adapter, base_model, good_adapter_dir, scorer, monkeypatch
):
    attach_eval_set(adapter, rows(3 * SCORE_CHUNK_ROWS))
    evaluation = queued_evaluation(adapter, good_adapter_dir)

    def score_then_supersede(version_uid, chunk, **kwargs):
        # the version is found incompatible (a re-check) while its first rows are scored
        AdapterVersion.objects.filter(uid=version_uid).update(compatible=False)
        return scorer(version_uid, chunk, **kwargs)

    monkeypatch.setattr(evaluations, "score_on_engine", score_then_supersede)
    result = evaluate_adapter_version.apply(args=[evaluation.pk]).get()

    assert result == "cancelled"
    assert scorer.calls == [(str(evaluation.version.uid), SCORE_CHUNK_ROWS)]  # one request
    evaluation.refresh_from_db()
    assert evaluation.status == "failed"
    assert evaluation.reason.startswith("superseded: ") and "no longer checked compatible" in (
        evaluation.reason
    )
    version = AdapterVersion.objects.get(pk=evaluation.version_id)
    assert version.quality == Quality.PENDING  # untouched: this evaluation no longer speaks for it


def test_every_chunk_is_scored_and_the_figures_are_over_all_rows(
    adapter, base_model, good_adapter_dir, scorer
):
    attach_eval_set(adapter, rows(2 * SCORE_CHUNK_ROWS + 1))
    evaluation = queued_evaluation(adapter, good_adapter_dir)
    evaluate_adapter_version.apply(args=[evaluation.pk])
    evaluation.refresh_from_db()
    uid = str(evaluation.version.uid)
    assert scorer.calls == [(uid, SCORE_CHUNK_ROWS), (uid, SCORE_CHUNK_ROWS), (uid, 1)]
    assert evaluation.status == "passed" and len(evaluation.rows) == 2 * SCORE_CHUNK_ROWS + 1
    assert evaluation.adapter_tokens == 4 * (2 * SCORE_CHUNK_ROWS + 1)
    assert evaluation.adapter_perplexity == pytest.approx(scorer.default_ppl)
