"""Faults: storage that fails, workers that die, bytes that change. Nothing stays stuck and
nothing unverified is staged."""

import socket
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.files.storage import storages
from django.utils import timezone

from audit.models import AuditEvent
from platform_site.celery import app as celery_app
from registry.models import AdapterVersion
from registry.services.versions import (
    adapter_version_create,
    adapter_version_validate,
    versions_sweep_stuck,
)
from registry.staging import StagingError, ensure_staged
from registry.tasks import sweep_stuck_validations
from tests.registry.conftest import ALICE_ACTOR, make_ready_version, wait_for


def create_version(adapter, folder: Path) -> AdapterVersion:
    with (
        open(folder / "adapter_config.json", "rb") as config,
        open(folder / "adapter_model.safetensors", "rb") as weights,
    ):
        return adapter_version_create(
            adapter=adapter, config=config, weights=weights, actor=ALICE_ACTOR
        )[0]


def refused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again on exit: connections are refused


def final_status(version):
    version.refresh_from_db()
    return version.status in ("ready", "rejected") and version


def test_storage_failing_during_validation_is_retried_then_rejected_with_the_reason(
    transactional_db, s3, monkeypatch, request, adapter, good_adapter_dir
):
    # The worker's storage endpoint refuses every connection; this process's works.
    monkeypatch.setenv("AWS_S3_ENDPOINT_URL", f"http://127.0.0.1:{refused_port()}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    monkeypatch.setenv("LORAPLEX_TASK_RETRIES", "2")
    monkeypatch.setenv("LORAPLEX_TASK_RETRY_BACKOFF_SECONDS", "0.2")
    request.getfixturevalue("live_worker")

    version = create_version(adapter, good_adapter_dir)
    version = wait_for(lambda: final_status(version), what="the worker to give up")
    assert version.status == "rejected"
    assert version.infra_failure is True
    assert version.status_detail.startswith("object storage failed 3 times")
    assert "adapter_config.json (EndpointConnectionError)" in version.status_detail
    assert "127.0.0.1" not in version.status_detail  # endpoints stay in the log
    assert version.report[-1]["name"] == "infrastructure"
    event = AuditEvent.objects.get(verb="version.rejected")
    assert event.actor == "system:validator" and event.object_repr == "support-bot/v1"

    # The same bytes again are a new version, not the one refused for a storage fault.
    again, created = adapter_version_create(
        adapter=adapter,
        config=open(good_adapter_dir / "adapter_config.json", "rb"),  # noqa: SIM115
        weights=open(good_adapter_dir / "adapter_model.safetensors", "rb"),  # noqa: SIM115
        actor=ALICE_ACTOR,
    )
    assert created and again.number == 2


def test_a_validation_lost_with_its_worker_is_picked_up_again_by_the_sweep(
    transactional_db, s3, request, adapter, good_adapter_dir
):
    version = create_version(adapter, good_adapter_dir)
    celery_app.control.purge()  # the worker that took the message died with it...
    AdapterVersion.objects.filter(pk=version.pk).update(  # ...after it had started
        status="validating",
        attempts=1,
        validation_started_at=timezone.now() - timedelta(hours=1),
    )
    request.getfixturevalue("live_worker")

    counts = sweep_stuck_validations.apply_async().get(timeout=30)
    assert counts == {"requeued": 1, "rejected": 0}
    version = wait_for(lambda: final_status(version), what="the re-queued validation")
    assert version.status == "ready", version.status_detail
    assert version.attempts == 2
    requeue = AuditEvent.objects.get(verb="version.requeue")
    assert requeue.actor == "system:sweep"
    assert (requeue.before["attempts"], requeue.after["attempts"]) == (1, 2)


@pytest.mark.django_db
def test_the_sweep_gives_up_after_the_maximum_attempts_and_says_why(
    adapter, good_adapter_dir, settings
):
    settings.VALIDATION_MAX_ATTEMPTS = 3
    long_ago = timezone.now() - timedelta(seconds=settings.VALIDATION_DEADLINE_SECONDS + 1)
    exhausted = create_version(adapter, good_adapter_dir)
    AdapterVersion.objects.filter(pk=exhausted.pk).update(
        status="validating", attempts=3, validation_started_at=long_ago
    )
    assert versions_sweep_stuck() == {"requeued": 0, "rejected": 1}
    exhausted.refresh_from_db()
    assert exhausted.status == "rejected" and exhausted.infra_failure
    assert "validation started 3 times and never finished" in exhausted.status_detail
    assert versions_sweep_stuck() == {"requeued": 0, "rejected": 0}  # decided stays decided


@pytest.mark.django_db
def test_the_sweep_leaves_running_validations_alone_and_requeues_lost_messages(
    adapter, good_adapter_dir, second_adapter_dir, settings
):
    running = create_version(adapter, good_adapter_dir)
    AdapterVersion.objects.filter(pk=running.pk).update(
        status="validating", attempts=1, validation_started_at=timezone.now()
    )
    lost = create_version(adapter, second_adapter_dir)
    old = timezone.now() - timedelta(seconds=settings.VALIDATION_DEADLINE_SECONDS + 1)
    AdapterVersion.objects.filter(pk=lost.pk).update(created_at=old)
    assert versions_sweep_stuck() == {"requeued": 1, "rejected": 0}
    lost.refresh_from_db()
    running.refresh_from_db()
    assert lost.status == "validating" and lost.attempts == 1
    assert running.attempts == 1


def test_the_sweep_runs_periodically_from_the_beat_schedule(settings):
    from django.conf import settings as live

    schedule = live.CELERY_BEAT_SCHEDULE["registry-sweep-stuck-validations"]
    assert schedule["task"] == sweep_stuck_validations.name
    assert schedule["schedule"] > 0
    celery_app.loader.import_default_modules()
    assert sweep_stuck_validations.name in celery_app.tasks


@pytest.mark.django_db
def test_a_missing_object_rejects_at_once(adapter, good_adapter_dir):
    version = create_version(adapter, good_adapter_dir)
    storages["default"].delete(version.weights_key)
    adapter_version_validate(version_id=version.pk)
    version.refresh_from_db()
    assert version.status == "rejected" and version.infra_failure
    assert "stored adapter_model.safetensors is missing" in version.status_detail


@pytest.mark.django_db
def test_bytes_changed_in_storage_after_upload_are_rejected(adapter, good_adapter_dir):
    version = create_version(adapter, good_adapter_dir)
    path = Path(storages["default"].path(version.weights_key))
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    adapter_version_validate(version_id=version.pk)
    version.refresh_from_db()
    assert version.status == "rejected"
    assert version.status_detail.startswith("sha256: stored bytes changed since upload")


@pytest.mark.django_db
def test_staging_refuses_bytes_that_changed_and_leaves_no_folder(
    adapter, good_adapter_dir, settings
):
    version = make_ready_version(adapter, good_adapter_dir)
    path = Path(storages["default"].path(version.config_key))
    path.write_bytes(path.read_bytes().replace(b'"r": 4', b'"r": 5'))
    with pytest.raises(StagingError, match="stored bytes changed since upload"):
        ensure_staged(version)
    cache = settings.ADAPTER_CACHE_DIR
    assert not cache.exists() or list(cache.iterdir()) == []


@pytest.mark.django_db
def test_storage_down_during_an_upload_is_503_and_leaves_nothing(
    s3, settings, monkeypatch, adapter, alice, user_client, good_adapter_dir
):
    from tests.registry.conftest import upload

    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    dead = f"http://127.0.0.1:{refused_port()}"
    settings.STORAGES = {
        **settings.STORAGES,
        "default": {
            **settings.STORAGES["default"],
            "OPTIONS": {**settings.STORAGES["default"]["OPTIONS"], "endpoint_url": dead},
        },
    }
    response = upload(user_client(alice), "support-bot", good_adapter_dir)
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "storage_unavailable"
    assert "(EndpointConnectionError)" in response.json()["error"]["message"]
    assert "127.0.0.1" not in response.json()["error"]["message"]
    assert AdapterVersion.objects.count() == 0
    settings.STORAGES = {  # storage is back: nothing was left in the bucket
        **settings.STORAGES,
        "default": {
            **settings.STORAGES["default"],
            "OPTIONS": {**settings.STORAGES["default"]["OPTIONS"], "endpoint_url": s3.endpoint},
        },
    }
    assert s3.client.list_objects_v2(Bucket=s3.bucket).get("KeyCount") == 0
