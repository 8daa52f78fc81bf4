"""The quality gate against a live engine (`manage.py serve`, the tiny model): an adapter trained
in the test with its eval set is uploaded, validated, evaluated (its figures equal to a
transformers + PEFT computation within 1e-3, far below the base model's), then the base model
is upgraded twice: to weights with enough noise to degrade the adapter (refused, with the
figures), then to weights with a little (passed against its first figure).

The evaluation task runs in this process (eagerly, the real task and service) and reaches the
engine through `score_on_engine` with the operator token, as the worker does. Each revision
needs a fresh `serve`: an engine serves the weights it started with.
"""

import math

import httpx
import pytest

from platform_site import operator_protocol as protocol
from tests.adapter_versions import create_ready_version, create_version
from tests.inference.conftest import start_server, stop_server
from tests.registry.conftest import run_evaluations
from tests.tiny_llama import make_tiny_llama
from tests.trained_adapter import (
    DEGRADING_NOISE,
    HARMLESS_NOISE,
    eval_set_jsonl,
    noisy_copy,
    reference_nll,
    task_rows,
    train_adapter,
)

NAME = "tiny-gated"
TOKEN = "evaluation-operator-token"
pytestmark = pytest.mark.django_db(transaction=True)  # the server reads committed rows


@pytest.fixture
def no_broker(monkeypatch):
    """The tasks run here, not in a worker: nothing goes to the broker."""
    from registry import queue

    monkeypatch.setattr(queue, "send_on_commit", lambda *args: None)


@pytest.fixture
def gate(tmp_path, settings):
    """The base model, a tenant with a key, an adapter trained on the task, its eval set."""
    import io

    from registry.services.adapters import adapter_create
    from registry.services.base_models import base_model_import
    from registry.services.eval_sets import eval_set_attach
    from tenants.services import api_key_create, tenant_create

    settings.OPERATOR_TOKEN = TOKEN
    base_dir = make_tiny_llama(tmp_path / "base")
    rows = task_rows()
    adapter_dir = train_adapter(base_dir, tmp_path / "adapter", base_model_name=NAME)
    base, _ = base_model_import(name=NAME, path=base_dir, default=True)
    tenant = tenant_create(slug="gated", name="Gated")
    _, key = api_key_create(
        tenant=tenant, name="all", scopes=["inference", "registry:read", "registry:write"]
    )
    adapter = adapter_create(tenant=tenant, name="formatter", actor="test")
    eval_set_attach(adapter=adapter, file=io.BytesIO(eval_set_jsonl(rows.eval)), actor="test")
    return {
        "tmp": tmp_path,
        "base_dir": base_dir,
        "adapter_dir": adapter_dir,
        "eval_rows": rows.eval,
        "adapter": adapter,
        "key": key,
        "base": base,
    }


def serve(gate, settings):
    url, proc, log = start_server(
        gate["tmp"],
        {"LORAPLEX_OPERATOR_TOKEN": TOKEN, "LORAPLEX_BASE_MODEL": NAME},
        name="serve-gated",
    )
    settings.ENGINE_URLS = [url]
    return url, proc, log


def complete(url: str, key: str) -> httpx.Response:
    body = {"model": "formatter", "prompt": "Q: abc\n", "max_tokens": 4}
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=60)


def upgrade(gate, folder):
    from registry.services.base_models import base_model_import, base_model_recheck

    base, changed = base_model_import(name=NAME, path=folder)
    assert changed
    base_model_recheck(base_model_id=base.pk)
    return base


def test_trained_adapter_is_evaluated_then_degraded_and_passed_across_base_upgrades(gate, settings):
    from registry.models import AdapterVersion

    adapter_dir = gate["adapter_dir"]
    version = create_ready_version(gate["adapter"], adapter_dir)
    assert version.quality == "pending"

    # ---- upload -> ready -> evaluated
    url, proc, log = serve(gate, settings)
    try:
        pending = complete(url, gate["key"])
        assert pending.status_code == 409, pending.text
        assert "evaluation pending on revision" in pending.json()["error"]["message"]
        (first,) = run_evaluations()
        assert first.status == "passed", first.reason
        assert complete(url, gate["key"]).status_code == 200
    finally:
        stop_server(proc)
    expected_adapter = reference_nll(gate["base_dir"], adapter_dir, gate["eval_rows"])
    expected_base = reference_nll(gate["base_dir"], None, gate["eval_rows"])
    assert first.adapter_tokens == expected_adapter["tokens"] == first.base_tokens
    assert first.adapter_nll == pytest.approx(expected_adapter["nll"], abs=1e-3)
    assert first.base_nll == pytest.approx(expected_base["nll"], abs=1e-3)
    assert math.log(first.adapter_perplexity) == pytest.approx(expected_adapter["nll"], abs=1e-3)
    for got, adapter_row, base_row in zip(
        first.rows, expected_adapter["rows"], expected_base["rows"], strict=True
    ):
        assert got["tokens"] == adapter_row["tokens"]
        assert got["adapter_nll"] == pytest.approx(adapter_row["nll"], abs=1e-3)
        assert got["base_nll"] == pytest.approx(base_row["nll"], abs=1e-3)
    assert first.adapter_perplexity < first.base_perplexity / 10  # it learnt the task
    reference = first.adapter_perplexity

    # ---- a revision whose noise degrades the adapter: pending, then degraded, refused
    noisy = upgrade(
        gate, noisy_copy(gate["base_dir"], gate["tmp"] / "noisy", scale=DEGRADING_NOISE)
    )
    version.refresh_from_db()
    assert version.quality == "pending" and version.quality_revision == noisy.revision
    url, proc, log = serve(gate, settings)
    try:
        refused = complete(url, gate["key"])
        assert refused.status_code == 409
        assert f"evaluation pending on revision {noisy.revision[:12]}" in refused.text
        (degraded,) = run_evaluations()
        assert degraded.status == "degraded", degraded.reason
        assert degraded.reference_perplexity == reference
        assert degraded.adapter_perplexity > reference * settings.EVAL_MAX_PPL_RATIO
        error = complete(url, gate["key"]).json()["error"]
        assert error["code"] == "model_not_servable"
        assert f"degraded on revision {noisy.revision[:12]}…: perplexity" in error["message"]
        assert "at its first evaluation (x" in error["message"]
        # the engine scores it still (the gate is the registry's): operators can measure it
        headers = protocol.authorization(TOKEN)
        body = {"adapter_version": str(version.uid), "rows": gate["eval_rows"][:1]}
        scored = httpx.post(f"{url}{protocol.path(protocol.SCORE)}", json=body, headers=headers)
        assert scored.status_code == 200, scored.text
    finally:
        stop_server(proc)
    version.refresh_from_db()
    assert version.quality == "degraded" and not version.servable_on(noisy)

    # ---- a revision with a little noise: re-evaluated against the first figure, passed
    gentle = upgrade(
        gate, noisy_copy(gate["base_dir"], gate["tmp"] / "gentle", scale=HARMLESS_NOISE)
    )
    url, proc, log = serve(gate, settings)
    try:
        (passed,) = run_evaluations()
        assert passed.status == "passed", passed.reason
        assert passed.reference_perplexity == reference and passed.base_revision == gentle.revision
        assert passed.adapter_perplexity <= reference * settings.EVAL_MAX_PPL_RATIO
        assert complete(url, gate["key"]).status_code == 200
    finally:
        stop_server(proc)
    assert "Traceback" not in log.read_text(), log.read_text()[-4000:]
    version = AdapterVersion.objects.get(pk=version.pk)
    assert version.quality == "passed" and version.reference_evaluation_id == first.pk
    assert [e.status for e in version.evaluations.order_by("pk")] == [
        "passed",
        "degraded",
        "passed",
    ]


@pytest.fixture
def engine_for_the_worker(gate, settings, monkeypatch):
    """A live engine, named to the worker (started after this) through its environment."""
    url, proc, log = serve(gate, settings)
    monkeypatch.setenv("LORAPLEX_ENGINE_URLS", url)
    monkeypatch.setenv("LORAPLEX_OPERATOR_TOKEN", TOKEN)
    yield url
    stop_server(proc)


def test_a_real_worker_validates_then_evaluates_an_upload_on_the_engine(
    gate, engine_for_the_worker, live_worker
):
    """Upload (REST, with the eval set in the same call) -> the worker validates it, then
    scores it on the engine -> passed and served; nothing is called in this process."""
    from django.core.files.uploadedfile import SimpleUploadedFile
    from rest_framework.test import APIClient

    from registry.models import AdapterVersion
    from tests.registry.conftest import files_of
    from tests.waiting import wait_for

    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {gate['key']}")
    body = files_of(gate["adapter_dir"]) | {
        "eval": SimpleUploadedFile("eval.jsonl", eval_set_jsonl(gate["eval_rows"][:4]))
    }
    response = api.post("/api/v1/adapters/formatter/versions/", body, format="multipart")
    assert response.status_code == 202, response.content
    version = wait_for(
        lambda: AdapterVersion.objects.filter(quality__in=["passed", "degraded", "failed"]).first(),
        what="the worker's evaluation",
    )
    evaluation = version.evaluations.get()
    assert version.quality == "passed", version.quality_detail
    assert evaluation.trigger == "upload" and evaluation.eval_set.rows == 4
    assert evaluation.adapter_perplexity < evaluation.base_perplexity
    assert complete(engine_for_the_worker, gate["key"]).status_code == 200


def test_a_base_upgrade_waits_for_the_engine_to_restart_on_it_then_passes(
    gate, settings, monkeypatch, request
):
    """The README's base upgrade with a real worker and engine: `import_base_model` of a mildly
    changed revision while the engine serves the old one (it refuses to score: 409), then
    stops it (connections refused), then starts it on the new weights only after the worker
    has met each several times. The re-evaluation waits through all of it, the version
    pending and saying why, and passes."""
    from django.core.management import call_command
    from rest_framework.test import APIClient

    from registry.models import AdapterVersion, BaseModel, Evaluation
    from tests import processes
    from tests.waiting import wait_for

    port = processes.free_port()
    url = f"http://127.0.0.1:{port}"
    worker_env = {
        "LORAPLEX_ENGINE_URLS": url,
        "LORAPLEX_OPERATOR_TOKEN": TOKEN,
        "LORAPLEX_TASK_RETRY_BACKOFF_SECONDS": "0.1",
        "LORAPLEX_EVAL_RETRY_MAX_SECONDS": "0.5",
        "LORAPLEX_EVAL_WAIT_SECONDS": "900",  # a hang guard: the engine is back long before
    }
    for name, value in worker_env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(processes, "free_port", lambda: port)  # each `serve` at the worker's URL
    old_url, proc, _ = serve(gate, settings)
    assert old_url == url
    try:
        request.getfixturevalue("live_worker")
        version = create_version(gate["adapter"], gate["adapter_dir"])
        old = gate["base"].revision

        def quality(expected: str):
            found = AdapterVersion.objects.get(pk=version.pk)
            return found if found.quality == expected else None

        first = wait_for(lambda: quality("passed"), what="the first evaluation").evaluations.get()
        assert first.base_revision == old

        gentle = noisy_copy(gate["base_dir"], gate["tmp"] / "gentle", scale=HARMLESS_NOISE)
        call_command("import_base_model", "--hf-dir", str(gentle), "--name", NAME)
        new = BaseModel.objects.get(name=NAME).revision
        assert new != old

        def tried(times: int, words: str):
            def check():
                found = Evaluation.objects.filter(version=version, base_revision=new).first()
                if found is not None and found.attempts >= times and words in found.reason:
                    return found
                return None

            return check

        # the engine on the old weights refuses to score for the new revision: wait
        seen = wait_for(tried(3, f"revision {old[:12]}"), what="the worker meeting the old engine")
        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Bearer {gate['key']}")
        shown = api.get(f"/api/v1/adapters/formatter/versions/{version.number}/").json()
        assert shown["quality"] == "pending" and shown["quality_revision"] == new
        assert (
            f"evaluation pending on revision {new[:12]}…: waiting to be" in shown["quality_detail"]
        )
        assert shown["evaluation"]["status"] in ("queued", "running")

        # restarting: nothing listens on its port
        stop_server(proc)
        wait_for(tried(seen.attempts + 3, "unreachable"), what="the worker meeting no engine")
        assert quality("pending") is not None

        # up again, on the new weights
        _, proc, log = serve(gate, settings)
        evaluation = wait_for(
            lambda: Evaluation.objects.filter(
                version=version, base_revision=new, status__in=Evaluation.FINISHED
            ).first(),
            what="the re-evaluation",
        )
        assert evaluation.status == "passed", evaluation.reason
        assert evaluation.attempts >= seen.attempts + 4
        assert evaluation.reference_perplexity == first.adapter_perplexity
        assert evaluation.adapter_perplexity <= first.adapter_perplexity * 1.02
        assert quality("passed").quality_revision == new
        assert complete(url, gate["key"]).status_code == 200
        assert "Traceback" not in log.read_text(), log.read_text()[-4000:]
    finally:
        stop_server(proc)
