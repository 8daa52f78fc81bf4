"""The quality gate (issue 13): evaluations, the gate on serving and on aliases, base model
upgrades, operators' overrides and re-runs, and what the API, the audit trail and /metrics
show of it.

The engine's scoring call is replaced by `scorer` (tests/registry/conftest.py FakeScorer),
which answers chosen perplexities in the engine's shape; the evaluation task itself runs, in
this process (`run_evaluations`). The engine unreachable is the real client against a port
nothing listens on. tests/inference/operator/test_evaluation_live.py runs the same against a live
engine, with a trained adapter and noisy base revisions.
"""

import pytest
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from audit.models import AuditEvent
from inference.errors import ModelNotServable
from inference.resolution import resolve_model
from registry.errors import InvalidTransition, NotServable
from registry.models import AdapterVersion, EvalSet, Evaluation
from registry.quality import verdict, why_not_passed
from registry.selectors import adapter_version_resolve, quality_progress
from registry.services.adapters import adapter_create
from registry.services.aliases import alias_set
from registry.services.base_models import base_model_import, base_model_recheck
from registry.services.eval_sets import eval_set_attach_default
from registry.services.evaluations import evaluation_override
from tenants.models import UsageRecord
from tests.processes import free_port
from tests.registry.conftest import (
    ALICE_ACTOR,
    BASE_NAME,
    attach_eval_set,
    make_ready_version,
    run_evaluations,
)
from tests.tiny_llama import make_tiny_llama

Quality = AdapterVersion.Quality
ALIASES = "/api/v1/adapters/support-bot/aliases"


@pytest.fixture(scope="module")
def retrained_base_dir(tmp_path_factory):
    """Same architecture as the tiny base, other weights: a new revision adapters still fit."""
    return make_tiny_llama(tmp_path_factory.mktemp("retrained"), seed=1)


@pytest.fixture
def client(tenant_a, alice, user_client):
    return user_client(alice)


def resolve(tenant, name="support-bot", **kwargs):
    return adapter_version_resolve(tenant=tenant, adapter_name=name, **kwargs)


def evaluated_version(adapter, folder):
    """A ready version of `adapter` (which has an eval set), evaluated: passed."""
    version = make_ready_version(adapter, folder)
    run_evaluations()
    version.refresh_from_db()
    assert version.quality == Quality.PASSED, version.quality_detail
    return version


def upgrade(base_dir):
    """A new revision of the served base model, re-checked (evaluations queued, not run)."""
    base, changed = base_model_import(name=BASE_NAME, path=base_dir)
    assert changed
    base_model_recheck(base_model_id=base.pk)
    return base


# ---------------------------------------------------------------- the gate itself


GATE = {"revision": "ab" * 32, "max_ratio": 1.10, "max_base_ratio": None}


def test_the_first_evaluation_sets_the_reference_and_passes_that_check():
    first = verdict(perplexity=50.0, base_perplexity=30.0, reference=None, **GATE)
    assert first.passed and first.ratio is None
    assert "its first evaluation, now its reference" in first.reason


@pytest.mark.parametrize(
    ("perplexity", "passed"),
    [(9.1, True), (10.0, True), (11.0, True), (11.0001, False), (14.2, False)],
)
def test_the_factor_is_inclusive_at_1_10(perplexity, passed):
    result = verdict(perplexity=perplexity, base_perplexity=30.0, reference=10.0, **GATE)
    assert result.passed is passed
    assert result.ratio == pytest.approx(perplexity / 10.0)


def test_a_degraded_verdict_says_which_figure_and_by_how_much():
    result = verdict(perplexity=14.2, base_perplexity=30.0, reference=9.1, **GATE)
    assert result.reason == (
        "degraded on revision abababababab…: perplexity 14.2 vs 9.1 at its first evaluation "
        "(x1.56 > x1.10)"
    )
    just_over = verdict(perplexity=11.0001, base_perplexity=30.0, reference=10.0, **GATE)
    assert "(x1.10001 > x1.10000)" in just_over.reason  # never "x1.10 > x1.10"


def test_the_base_ratio_check_is_off_by_default_and_on_when_set(settings):
    from registry.quality import factors

    assert settings.EVAL_MAX_BASE_RATIO is None and settings.EVAL_MAX_PPL_RATIO == 1.10
    assert factors() == (1.10, None)
    worse_than_base = {"perplexity": 45.0, "base_perplexity": 30.0, "reference": None}
    assert verdict(**worse_than_base, **GATE).passed
    settings.EVAL_MAX_BASE_RATIO = 1.0
    max_ratio, max_base_ratio = factors()
    result = verdict(
        **worse_than_base, revision="ab" * 32, max_ratio=max_ratio, max_base_ratio=max_base_ratio
    )
    assert not result.passed
    assert "perplexity 45 vs 30 for the base model alone (x1.50 > x1.00)" in result.reason
    better = verdict(
        perplexity=20.0, base_perplexity=30.0, reference=None, revision="ab" * 32,
        max_ratio=max_ratio, max_base_ratio=max_base_ratio,
    )  # fmt: skip
    assert better.passed


def test_the_factors_are_checked_at_start(settings):
    from platform_site.checks import quality_gate_factors

    assert quality_gate_factors(None) == []
    settings.EVAL_MAX_PPL_RATIO = 0.9
    settings.EVAL_MAX_BASE_RATIO = 0.0
    assert [e.id for e in quality_gate_factors(None)] == ["loraplex.E010", "loraplex.E011"]


# ---------------------------------------------------------------- upload -> evaluated


@pytest.mark.django_db
def test_a_version_is_not_servable_while_pending_and_servable_once_passed(
    tenant_a, adapter, good_adapter_dir, scorer, client
):
    eval_set = attach_eval_set(adapter)
    version = make_ready_version(adapter, good_adapter_dir)
    assert version.quality == Quality.PENDING
    evaluation = Evaluation.objects.get()
    assert evaluation.status == "queued" and evaluation.eval_set == eval_set
    assert evaluation.base_revision == adapter.base_model.revision

    with pytest.raises(
        NotServable,
        match=r"the newest ready one, support-bot/v1: evaluation pending on revision \w{12}…",
    ):
        resolve(tenant_a)
    with pytest.raises(ModelNotServable) as refused:
        resolve_model(tenant=tenant_a, name="support-bot:1", base_model_name=BASE_NAME)
    assert refused.value.status == 409 and refused.value.code == "model_not_servable"
    assert "evaluation pending on revision" in refused.value.message
    pending = client.put(f"{ALIASES}/production/", {"version": 1}, format="json")
    assert pending.status_code == 409
    assert pending.json()["error"]["code"] == "evaluation_not_passed"
    assert (
        "v1 has not passed its evaluation: evaluation pending" in pending.json()["error"]["message"]
    )

    scorer.default_ppl, scorer.base_ppl = 9.1, 31.5
    run_evaluations()
    version.refresh_from_db()
    evaluation.refresh_from_db()
    assert scorer.calls == [(str(version.uid), 2)]
    assert evaluation.status == "passed" and evaluation.adapter_perplexity == 9.1
    assert evaluation.base_perplexity == 31.5 and evaluation.reference_perplexity == 9.1
    assert evaluation.adapter_tokens == 8 and len(evaluation.rows) == 2
    assert evaluation.duration_seconds is not None and evaluation.attempts == 1
    assert version.quality == Quality.PASSED and version.reference_evaluation == evaluation
    assert version.accepted_revision == evaluation.base_revision
    assert resolve(tenant_a).pk == version.pk
    assert client.put(f"{ALIASES}/production/", {"version": 1}, format="json").status_code == 201

    event = AuditEvent.objects.get(verb="evaluation.passed")
    assert event.actor == "system:evaluator" and event.object_repr == "support-bot/v1"
    assert event.before["quality"] == "pending" and event.after["quality"] == "passed"
    assert event.after["adapter_perplexity"] == 9.1 and event.after["base_perplexity"] == 31.5


@pytest.mark.django_db
def test_the_version_json_shows_the_evaluation(tenant_a, adapter, good_adapter_dir, scorer, client):
    attach_eval_set(adapter)
    make_ready_version(adapter, good_adapter_dir)
    listed = client.get("/api/v1/adapters/support-bot/versions/").json()[0]
    assert listed["quality"] == "pending" and listed["evaluation"]["status"] == "queued"
    assert listed["evaluation"]["adapter"] is None and listed["reference"] is None

    scorer.default_ppl, scorer.base_ppl = 2.5, 40.0
    run_evaluations()
    body = client.get("/api/v1/adapters/support-bot/versions/1/").json()
    evaluation = body["evaluation"]
    assert body["quality"] == "passed" and body["quality_detail"].startswith("passed on revision")
    assert body["quality_revision"] == adapter.base_model.revision
    assert evaluation["status"] == "passed" and evaluation["trigger"] == "upload"
    assert evaluation["adapter"]["perplexity"] == 2.5 and evaluation["adapter"]["tokens"] == 8
    assert evaluation["base"]["perplexity"] == 40.0
    assert evaluation["base_ratio"] == pytest.approx(2.5 / 40.0)
    assert evaluation["base_revision"] == adapter.base_model.revision
    assert evaluation["eval_set"]["kind"] == "own" and evaluation["eval_set"]["rows"] == 2
    assert [set(r) for r in evaluation["rows"]] == [{"tokens", "adapter_nll", "base_nll"}] * 2
    assert body["reference"]["perplexity"] == 2.5 and body["override"] is None
    listed = client.get("/api/v1/adapters/support-bot/versions/").json()[0]
    assert "rows" not in listed["evaluation"]  # one version's GET carries the rows


@pytest.mark.django_db
def test_the_generic_eval_set_serves_adapters_without_their_own(
    adapter, base_model, good_adapter_dir, scorer
):
    import io

    generic, _ = eval_set_attach_default(
        base_model=base_model,
        file=io.BytesIO(b'{"prompt": "Hi", "completion": " there"}\n'),
        actor="system:operator",
    )
    make_ready_version(adapter, good_adapter_dir)
    (evaluation,) = run_evaluations()
    assert evaluation.eval_set == generic and evaluation.status == "passed"
    assert scorer.calls[0][1] == 1


# ---------------------------------------------------------------- no eval set at all


@pytest.mark.django_db
def test_without_any_eval_set_a_version_passes_unmeasured_at_once(
    tenant_a, adapter, good_adapter_dir, scorer
):
    version = make_ready_version(adapter, good_adapter_dir)
    assert version.quality == Quality.PASSED and scorer.calls == []
    assert "unmeasured: there is no eval set" in version.quality_detail
    evaluation = version.evaluations.get()
    assert evaluation.status == "passed" and evaluation.eval_set is None
    assert version.reference_evaluation is None
    assert resolve(tenant_a).pk == version.pk  # usable: it serves


@pytest.mark.django_db
def test_an_eval_set_attached_later_measures_versions_accepted_unmeasured(
    tenant_a, adapter, good_adapter_dir, scorer
):
    version = make_ready_version(adapter, good_adapter_dir)
    attach_eval_set(adapter)
    (evaluation,) = run_evaluations()
    version.refresh_from_db()
    assert evaluation.trigger == "eval_set" and evaluation.status == "passed"
    assert version.reference_evaluation == evaluation and version.quality == Quality.PASSED
    assert resolve(tenant_a).pk == version.pk  # servable throughout


@pytest.mark.django_db
def test_without_a_reference_a_base_upgrade_fails_the_version_until_overridden(
    tenant_a, adapter, good_adapter_dir, retrained_base_dir, scorer
):
    """Unmeasured is not passed: after an upgrade there is nothing to hold it to."""
    version = make_ready_version(adapter, good_adapter_dir)
    base = upgrade(retrained_base_dir)
    version.refresh_from_db()
    assert version.quality == Quality.FAILED and scorer.calls == []
    assert "no reference figure" in version.quality_detail
    with pytest.raises(NotServable, match="no reference figure"):
        resolve(tenant_a)
    attach_eval_set(adapter)  # too late to measure what it was accepted on
    assert run_evaluations() == []
    evaluation_override(version=version, actor="admin:root", note="checked by hand")
    version.refresh_from_db()
    assert version.quality == Quality.OVERRIDDEN and version.quality_revision == base.revision
    assert resolve(tenant_a).pk == version.pk
    call_command("evaluate_versions", "tenant-a/support-bot:1")  # a re-run keeps the override
    version.refresh_from_db()
    assert version.quality == Quality.OVERRIDDEN and resolve(tenant_a).pk == version.pk


# ---------------------------------------------------------------- rollout gates


@pytest.mark.django_db
def test_promoting_a_degraded_version_is_refused_saying_which_figure(
    tenant_a, adapter, good_adapter_dir, retrained_base_dir, scorer, client
):
    attach_eval_set(adapter)
    scorer.default_ppl = 9.1
    version = evaluated_version(adapter, good_adapter_dir)
    alias_set(adapter=adapter, name="production", version_number=1, actor=ALICE_ACTOR)

    base = upgrade(retrained_base_dir)
    version.refresh_from_db()
    assert version.quality == Quality.PENDING
    scorer.default_ppl = 14.2
    (evaluation,) = run_evaluations()
    assert evaluation.status == "degraded" and evaluation.trigger == "base_upgrade"
    assert evaluation.reference_perplexity == 9.1 and evaluation.adapter_perplexity == 14.2
    reason = (
        f"degraded on revision {base.revision[:12]}…: perplexity 14.2 vs 9.1 at its first "
        "evaluation (x1.56 > x1.10)"
    )
    assert evaluation.reason == reason
    version.refresh_from_db()
    assert version.quality == Quality.DEGRADED and version.quality_detail == reason

    with pytest.raises(NotServable) as refused:  # production still points at it
        resolve(tenant_a)
    assert str(refused.value) == f"support-bot/v1: {reason}"
    for alias in ("production", "canary"):
        response = client.put(f"{ALIASES}/{alias}/", {"version": 1}, format="json")
        assert response.status_code == 409
        error = response.json()["error"]
        assert error["code"] == "evaluation_not_passed" and reason in error["message"]

    event = AuditEvent.objects.get(verb="evaluation.degraded")
    assert event.before["quality"] == "pending" and event.after["quality"] == "degraded"
    assert (event.after["reference_perplexity"], event.after["adapter_perplexity"]) == (9.1, 14.2)


@pytest.mark.django_db
def test_promoting_an_unevaluated_version_is_refused(tenant_a, adapter, good_adapter_dir, client):
    version = make_ready_version(adapter, good_adapter_dir)
    AdapterVersion.objects.filter(pk=version.pk).update(quality=Quality.UNEVALUATED)
    response = client.put(f"{ALIASES}/production/", {"version": 1}, format="json")
    assert response.status_code == 409
    assert "not evaluated on revision" in response.json()["error"]["message"]


@pytest.mark.django_db
def test_a_new_version_that_passes_replaces_a_degraded_one(
    tenant_a, adapter, good_adapter_dir, second_adapter_dir, retrained_base_dir, scorer
):
    attach_eval_set(adapter)
    scorer.default_ppl = 9.1
    evaluated_version(adapter, good_adapter_dir)
    upgrade(retrained_base_dir)
    scorer.default_ppl = 14.2
    run_evaluations()
    scorer.default_ppl = 8.0  # retrained on the new base: its own first figure
    v2 = evaluated_version(adapter, second_adapter_dir)
    assert resolve(tenant_a).pk == v2.pk  # the newest servable one
    adapter.base_model.refresh_from_db()  # now at the new revision
    alias_set(adapter=adapter, name="production", version_number=2, actor=ALICE_ACTOR)


# ---------------------------------------------------------------- base model upgrades


@pytest.mark.django_db
def test_an_upgrade_makes_every_version_pending_and_reevaluates_most_used_first(
    tenant_a, adapter, base_model, good_adapter_dir, second_adapter_dir, retrained_base_dir, scorer
):
    other = adapter_create(tenant=tenant_a, name="other-bot", actor=ALICE_ACTOR)
    attach_eval_set(adapter)
    attach_eval_set(other)
    quiet = evaluated_version(adapter, good_adapter_dir)
    busy = evaluated_version(other, second_adapter_dir)
    UsageRecord.objects.bulk_create(
        [UsageRecord(tenant=tenant_a, adapter_version=busy, model="other-bot", endpoint="chat")] * 3
    )

    base, changed = base_model_import(name=BASE_NAME, path=retrained_base_dir)
    assert changed
    assert set(AdapterVersion.objects.values_list("quality", "quality_revision")) == {
        (Quality.PENDING, base.revision)
    }
    progress = quality_progress(base_model=base)
    assert progress.counts[Quality.PENDING] == 2 and progress.done == 0
    base_model_recheck(base_model_id=base.pk)
    queued = Evaluation.objects.filter(status="queued").order_by("pk")
    assert [e.version_id for e in queued] == [busy.pk, quiet.pk]  # the most used first
    assert {e.trigger for e in queued} == {"base_upgrade"}

    scorer.adapter_ppl = {str(busy.uid): 9.5, str(quiet.uid): 30.0}  # +5.6 %, x3.3
    run_evaluations()
    busy.refresh_from_db()
    quiet.refresh_from_db()
    assert busy.quality == Quality.PASSED and quiet.quality == Quality.DEGRADED
    assert "vs 9 at its first evaluation (x1.06 <= x1.10)" in busy.quality_detail
    assert "perplexity 30 vs 9 at its first evaluation (x3.33 > x1.10)" in quiet.quality_detail
    progress = quality_progress(base_model=base)
    assert progress.counts[Quality.PASSED] == 1 and progress.counts[Quality.DEGRADED] == 1
    assert [v.pk for v in progress.degraded] == [quiet.pk] and progress.done == 2
    # before and after, side by side on the version's evaluations
    before, after = quiet.evaluations.order_by("pk")
    assert (before.adapter_perplexity, after.adapter_perplexity) == (9.0, 30.0)
    assert before.base_revision != after.base_revision == base.revision


@pytest.mark.django_db
def test_an_incompatible_version_is_not_evaluated_on_the_new_revision(
    tenant_a, adapter, good_adapter_dir, tmp_path, scorer
):
    attach_eval_set(adapter)
    version = evaluated_version(adapter, good_adapter_dir)
    shallow = make_tiny_llama(tmp_path / "shallow", num_layers=1)
    upgrade(shallow)
    version.refresh_from_db()
    assert version.compatible is False and version.quality == Quality.FAILED
    assert "not evaluated on revision" in version.quality_detail
    assert run_evaluations() == []


# ---------------------------------------------------------------- the engine unreachable


@pytest.mark.django_db
def test_an_unreachable_engine_is_waited_for_then_the_evaluation_fails_and_can_be_rerun(
    tenant_a, adapter, good_adapter_dir, settings, monkeypatch, worker_clock
):
    settings.ENGINE_URLS = [f"http://127.0.0.1:{free_port()}"]  # nothing listens there
    settings.EVAL_WAIT_SECONDS, settings.EVAL_RETRY_MAX_SECONDS = 120, 30
    attach_eval_set(adapter)
    version = make_ready_version(adapter, good_adapter_dir)
    (evaluation,) = run_evaluations()

    assert worker_clock == [2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]  # backoff, capped, 120 s
    attempts = len(worker_clock) + 1
    assert evaluation.status == "failed" and evaluation.attempts == attempts
    assert f"within 2 min (LORAPLEX_EVAL_WAIT_SECONDS), after {attempts} attempts" in (
        evaluation.reason
    )
    assert "unreachable" in evaluation.reason and "an operator can re-run it" in evaluation.reason
    assert settings.ENGINE_URLS[0] not in evaluation.reason  # tenants read it: no addresses
    version.refresh_from_db()
    assert version.quality == Quality.FAILED and version.quality_detail == evaluation.reason
    with pytest.raises(NotServable, match="evaluation failed on revision .* unreachable"):
        resolve(tenant_a)
    assert AuditEvent.objects.get(verb="evaluation.failed").after["quality"] == "failed"

    # an operator re-runs it once the engine is back
    from registry.services import evaluations

    monkeypatch.setattr(evaluations, "score_on_engine", _FixedScorer(9.0))
    call_command("evaluate_versions", "--quality", "failed")
    (rerun,) = run_evaluations()
    version.refresh_from_db()
    assert rerun.trigger == "rerun" and rerun.status == "passed"
    assert version.quality == Quality.PASSED and resolve(tenant_a).pk == version.pk


class _FixedScorer:
    def __init__(self, ppl):
        from tests.registry.conftest import FakeScorer

        self.fake = FakeScorer(default_ppl=ppl)

    def __call__(self, *args, **kwargs):
        return self.fake(*args, **kwargs)


@pytest.mark.django_db
def test_while_retrying_the_evaluation_says_why_and_the_version_stays_pending(
    adapter, good_adapter_dir, scorer
):
    from registry.engines import EngineCallFailed, ScoringFailed
    from registry.services.evaluations import EvaluationUnavailable, evaluation_run

    attach_eval_set(adapter)
    version = make_ready_version(adapter, good_adapter_dir)
    evaluation = Evaluation.objects.get()
    scorer.error = ScoringFailed(
        "no engine scored the eval set",
        [EngineCallFailed("http://engine:8000", "unreachable (refused)")],
        retryable=True,
    )
    with pytest.raises(EvaluationUnavailable, match="unreachable"):
        evaluation_run(evaluation_id=evaluation.pk)
    version.refresh_from_db()
    assert version.quality == Quality.PENDING
    # an engine still on the old weights: retried too, naming both revisions
    scorer.error, scorer.revision = None, "cd" * 32
    with pytest.raises(EvaluationUnavailable, match="serves revision cdcdcdcdcdcd…, not"):
        evaluation_run(evaluation_id=evaluation.pk)


@pytest.mark.django_db
def test_an_engine_refusing_the_eval_set_fails_at_once(adapter, good_adapter_dir, scorer):
    from registry.engines import EngineCallFailed, ScoringFailed

    attach_eval_set(adapter)
    make_ready_version(adapter, good_adapter_dir)
    scorer.error = ScoringFailed(
        "the engine refused the eval set",
        [EngineCallFailed("http://e", "HTTP 400: rows[1] is 900 tokens", status=400)],
        retryable=False,
    )
    (evaluation,) = run_evaluations()
    assert evaluation.status == "failed" and evaluation.attempts == 1
    assert "rows[1] is 900 tokens" in evaluation.reason


# ---------------------------------------------------------------- overrides


@pytest.fixture
def degraded(tenant_a, adapter, good_adapter_dir, retrained_base_dir, scorer):
    attach_eval_set(adapter)
    scorer.default_ppl = 9.1
    version = evaluated_version(adapter, good_adapter_dir)
    upgrade(retrained_base_dir)
    scorer.default_ppl = 14.2
    run_evaluations()
    version.refresh_from_db()
    assert version.quality == Quality.DEGRADED
    return version


def act(client, action, versions):
    return client.post(
        "/admin/registry/adapterversion/",
        {"action": action, "_selected_action": [v.pk for v in versions]},
        follow=True,
    )


def staff_client(django_user_model, *codenames):
    user = django_user_model.objects.create_user("ops", password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_an_operator_override_lets_a_degraded_version_serve_and_is_audited(
    tenant_a, degraded, django_user_model, client
):
    viewer = staff_client(django_user_model, "view_adapterversion")
    act(viewer, "override_quality", [degraded])
    degraded.refresh_from_db()
    assert degraded.quality == Quality.DEGRADED  # view-only staff act on nothing

    operator = Client()
    operator.force_login(django_user_model.objects.create_superuser("root", "r@x.test", "pw"))
    response = act(operator, "override_quality", [degraded])
    assert "overridden; it serves on this base revision" in response.content.decode()
    degraded.refresh_from_db()
    assert degraded.quality == Quality.OVERRIDDEN and degraded.quality_overridden_by == "admin:root"
    assert degraded.quality_overridden_at is not None
    assert "overridden by admin:root" in degraded.quality_detail
    assert resolve(tenant_a).pk == degraded.pk
    assert (
        client.put(f"{ALIASES}/canary/", {"version": 1, "weight": 5}, format="json").status_code
        == 201
    )

    event = AuditEvent.objects.get(verb="evaluation.override")
    assert event.actor == "admin:root" and event.tenant == tenant_a
    assert event.before["quality"] == "degraded" and event.after["quality"] == "overridden"
    assert event.after["evaluation"]["adapter_perplexity"] == 14.2
    body = client.get("/api/v1/adapters/support-bot/versions/1/").json()
    assert body["quality"] == "overridden" and body["override"]["by"] == "admin:root"
    # the audit trail is the tenant's too
    verbs = [e["verb"] for e in client.get("/api/v1/audit/?verb=evaluation.override").json()]
    assert verbs == ["evaluation.override"]


@pytest.mark.django_db
def test_only_degraded_or_failed_versions_can_be_overridden(
    tenant_a, adapter, good_adapter_dir, scorer
):
    attach_eval_set(adapter)
    version = make_ready_version(adapter, good_adapter_dir)
    with pytest.raises(InvalidTransition, match="its quality is pending"):
        evaluation_override(version=version, actor="admin:root")
    run_evaluations()
    version.refresh_from_db()
    with pytest.raises(InvalidTransition, match="its quality is passed"):
        evaluation_override(version=version, actor="admin:root")
    assert not AuditEvent.objects.filter(verb="evaluation.override").exists()


@pytest.mark.django_db
def test_the_override_command(degraded, tenant_a):
    with pytest.raises(CommandError, match="name a version as"):
        call_command("override_evaluation", "support-bot:1", "--by", "ana")
    call_command(
        "override_evaluation", "tenant-a/support-bot:1", "--by", "ana", "--note", "known drift"
    )
    degraded.refresh_from_db()
    assert degraded.quality == Quality.OVERRIDDEN
    event = AuditEvent.objects.get(verb="evaluation.override")
    assert event.actor == "operator:ana" and event.after["note"] == "known drift"
    with pytest.raises(CommandError, match="cannot be overridden"):
        call_command("override_evaluation", "tenant-a/support-bot:1", "--by", "ana")


@pytest.mark.django_db
def test_an_override_lasts_until_the_next_revision(degraded, tmp_path, scorer):
    evaluation_override(version=degraded, actor="admin:root")
    upgrade(make_tiny_llama(tmp_path / "third", seed=2))
    degraded.refresh_from_db()
    assert degraded.quality == Quality.PENDING
    scorer.default_ppl = 9.2
    run_evaluations()
    degraded.refresh_from_db()
    assert degraded.quality == Quality.PASSED  # held to its first figure again


# ---------------------------------------------------------------- the admin


@pytest.mark.django_db
def test_the_admin_shows_upgrade_progress_and_the_degraded_versions(degraded, django_user_model):
    operator = Client()
    operator.force_login(django_user_model.objects.create_superuser("root", "r@x.test", "pw"))
    base = degraded.adapter.base_model
    listing = operator.get("/admin/registry/basemodel/").content.decode()
    assert "1/1 evaluated: 1 degraded" in listing
    page = operator.get(reverse("admin:registry_basemodel_change", args=[base.pk])).content
    page = page.decode()
    assert "1 of 1 ready versions evaluated" in page
    assert "tenant-a/support-bot/v1" in page and "perplexity 14.2 vs 9.1" in page
    evaluations = operator.get("/admin/registry/evaluation/?status__exact=degraded")
    assert evaluations.status_code == 200 and "14.2" in evaluations.content.decode()
    one = Evaluation.objects.get(status="degraded")
    detail = operator.get(reverse("admin:registry_evaluation_change", args=[one.pk]))
    assert detail.status_code == 200 and "Per row (summed NLL)" in detail.content.decode()
    versions = operator.get("/admin/registry/adapterversion/?quality__exact=degraded")
    assert "degraded" in versions.content.decode()
    # read-only: the worker writes evaluations
    assert operator.get(reverse("admin:registry_evaluation_add")).status_code == 403
    assert (
        operator.post(reverse("admin:registry_evaluation_delete", args=[one.pk])).status_code == 403
    )


@pytest.mark.django_db
def test_the_rerun_action_queues_an_evaluation(degraded, django_user_model, scorer):
    operator = Client()
    operator.force_login(django_user_model.objects.create_superuser("root", "r@x.test", "pw"))
    response = act(operator, "evaluate", [degraded])
    assert "Queued the evaluation of 1 version(s)" in response.content.decode()
    degraded.refresh_from_db()
    assert degraded.quality == Quality.PENDING
    scorer.default_ppl = 9.0
    (rerun,) = run_evaluations()
    assert rerun.requested_by == "admin:root" and rerun.trigger == "rerun"
    degraded.refresh_from_db()
    assert degraded.quality == Quality.PASSED


# ---------------------------------------------------------------- metrics


def metric_values(text: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = sample.name + "".join(f"{{{k}={v}}}" for k, v in sorted(sample.labels.items()))
            values[key] = sample.value
    return values


@pytest.mark.django_db
def test_metrics_count_evaluations_queue_and_duration(degraded, settings):
    settings.METRICS_TOKEN = ""
    Evaluation.objects.create(
        version=degraded, base_revision="ef" * 32, trigger="rerun", requested_by="t"
    )
    values = metric_values(Client().get("/metrics").content.decode())
    assert values["loraplex_evaluations_run_total"] == 2
    assert values["loraplex_evaluations_passed_total"] == 1
    assert values["loraplex_evaluations_degraded_total"] == 1
    assert values["loraplex_evaluations_failed_total"] == 0
    assert values["loraplex_evaluations_queued"] == 1
    assert values["loraplex_evaluation_duration_seconds_count"] == 2
    assert values["loraplex_evaluation_duration_seconds_bucket{le=+Inf}"] == 2
    assert values["loraplex_adapter_versions_quality{quality=degraded}"] == 1


def test_metrics_still_answer_without_the_database(settings):
    """No database here (no django_db mark): the engine's metrics are still scraped."""
    settings.METRICS_TOKEN = ""
    response = Client().get("/metrics")
    assert response.status_code == 200
    assert "loraplex_http_requests" in response.content.decode()
    assert "loraplex_evaluations_run_total" not in response.content.decode()


# ---------------------------------------------------------------- deleting


@pytest.mark.django_db(transaction=True)
def test_deleting_an_adapter_takes_its_evaluations_and_eval_sets(
    tenant_a, adapter, good_adapter_dir, scorer, client
):
    attach_eval_set(adapter)
    evaluated_version(adapter, good_adapter_dir)
    attach_eval_set(adapter, rows=[{"prompt": "new", "completion": " set"}])
    assert EvalSet.objects.count() == 2  # the first is kept: an evaluation refers to it
    assert client.delete("/api/v1/adapters/support-bot/?force=true").status_code == 204
    assert not Evaluation.objects.exists() and not EvalSet.objects.exists()


@pytest.mark.django_db
def test_why_not_passed_words(adapter, good_adapter_dir):
    version = make_ready_version(adapter, good_adapter_dir)
    revision = adapter.base_model.revision
    assert why_not_passed(version, revision) is None
    assert why_not_passed(version, "0" * 64) == "not evaluated on revision 000000000000… yet"


@pytest.mark.django_db
def test_the_sweep_requeues_lost_evaluations_then_gives_up(
    adapter, good_adapter_dir, settings, monkeypatch
):
    from datetime import timedelta

    from django.utils import timezone

    from registry import queue
    from registry.services.evaluations import evaluations_sweep_stuck

    sent = []
    monkeypatch.setattr(queue, "send_on_commit", lambda *args: sent.append(args))
    attach_eval_set(adapter)
    version = make_ready_version(adapter, good_adapter_dir)
    evaluation = Evaluation.objects.get()
    most = 20
    assert evaluations_sweep_stuck(most_attempts=most) == {"requeued": 0, "failed": 0}  # not late

    late = timezone.now() - timedelta(seconds=settings.VALIDATION_DEADLINE_SECONDS + 1)
    Evaluation.objects.filter(pk=evaluation.pk).update(created_at=late)
    sent.clear()
    assert evaluations_sweep_stuck(most_attempts=most) == {"requeued": 1, "failed": 0}
    assert sent == [(queue.EVALUATE, evaluation.pk)]
    # a full deadline again before the next
    assert evaluations_sweep_stuck(most_attempts=most) == {"requeued": 0, "failed": 0}

    Evaluation.objects.filter(pk=evaluation.pk).update(
        status="running", started_at=late, attempts=most
    )
    assert evaluations_sweep_stuck(most_attempts=most) == {"requeued": 0, "failed": 1}
    evaluation.refresh_from_db()
    version.refresh_from_db()
    assert evaluation.status == "failed" and "never finished" in evaluation.reason
    assert version.quality == Quality.FAILED


def test_the_evaluation_sweep_runs_from_the_beat_schedule():
    from django.conf import settings

    from platform_site.celery import app
    from registry.tasks import sweep_stuck_evaluations

    schedule = settings.CELERY_BEAT_SCHEDULE["registry-sweep-stuck-evaluations"]
    assert schedule["task"] == sweep_stuck_evaluations.name in app.tasks
