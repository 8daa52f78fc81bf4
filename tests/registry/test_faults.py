"""Faults: storage that fails, workers that die, bytes that change. Nothing stays stuck and
nothing unverified is staged."""

import signal
import socket
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.files.storage import storages
from django.utils import timezone

from audit.models import AuditEvent
from platform_site.celery import app as celery_app
from registry import queue
from registry.models import AdapterVersion
from registry.services.versions import (
    adapter_version_create,
    adapter_version_validate,
    versions_sweep_stuck,
)
from registry.staging import StagingError, ensure_staged
from registry.tasks import sweep_stuck_validations
from tests import adapter_versions
from tests.faults.proxy import FaultProxy
from tests.faults.workers import start_worker, stop
from tests.registry.conftest import ALICE_ACTOR, make_ready_version, sha256_of
from tests.waiting import wait_for


def create_version(adapter, folder: Path) -> AdapterVersion:
    return adapter_versions.create_version(adapter, folder, actor=ALICE_ACTOR)


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


# ---------------------------------------------------------------- faults with real processes


@pytest.fixture
def proxy(s3):
    """A faulty network between a worker (or this process) and moto's S3."""
    proxy = FaultProxy(s3.endpoint)
    yield proxy
    proxy.close()


def publish(broker_url: str, task: str, *args) -> None:
    """Queue a task by name on that broker (not the configured one), as the services do."""
    with celery_app.connection_for_write(broker_url) as connection:
        celery_app.send_task(task, args=list(args), connection=connection)


def staged_folders(cache: Path) -> list[str]:
    """What the engine's loader can see: folders without a leading dot."""
    return (
        sorted(p.name for p in cache.iterdir() if not p.name.startswith("."))
        if cache.exists()
        else []
    )


def assert_staged_intact(cache: Path, version) -> None:
    folder = cache / version.uid.hex
    assert sha256_of(folder / "adapter_config.json") == version.config_sha256
    assert sha256_of(folder / "adapter_model.safetensors") == version.weights_sha256


def test_a_worker_killed_mid_download_leaves_no_folder_and_the_task_goes_to_another(
    transactional_db, s3, proxy, private_redis, adapter, good_adapter_dir, settings, tmp_path
):
    version = make_ready_version(adapter, good_adapter_dir)
    cache = settings.ADAPTER_CACHE_DIR
    common = {
        "CELERY_BROKER_URL": private_redis.url,
        "CELERY_RESULT_BACKEND": "",
        "LORAPLEX_BROKER_VISIBILITY_TIMEOUT": "3",
    }
    proxy.set("slow", rate=2048)  # the 8 KiB of weights take about 4 s
    first = start_worker(tmp_path / "worker-1.log", AWS_S3_ENDPOINT_URL=proxy.url, **common)
    second = None
    try:
        publish(private_redis.url, queue.STAGE, version.pk)
        taken = time.monotonic()

        def downloading():
            temps = [p for p in cache.glob(f".{version.uid.hex}.*") if p.is_dir()]
            return temps and (temps[0] / "adapter_model.safetensors").exists() and temps[0]

        temp = wait_for(downloading, what="the first worker to download the weights")
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        # Only the hidden temporary folder holds the partial copy: nothing the engine loads.
        assert staged_folders(cache) == []
        assert temp.name.startswith(".") and temp.exists()

        time.sleep(max(0.0, 3.5 - (time.monotonic() - taken)))  # past the visibility timeout
        second = start_worker(tmp_path / "worker-2.log", AWS_S3_ENDPOINT_URL=s3.endpoint, **common)
        wait_for(lambda: staged_folders(cache), what="the task redelivered")
        assert staged_folders(cache) == [version.uid.hex]
        assert_staged_intact(cache, version)
        assert "registry.stage_adapter_version" in (tmp_path / "worker-2.log").read_text()
    finally:
        stop(first)
        if second is not None:
            stop(second)


def test_staging_through_failing_storage_is_retried_then_given_up_leaving_nothing(
    transactional_db,
    s3,
    proxy,
    private_redis,
    adapter,
    good_adapter_dir,
    second_adapter_dir,
    settings,
    tmp_path,
):
    flaky = make_ready_version(adapter, good_adapter_dir)
    down = make_ready_version(adapter, second_adapter_dir)
    cache = settings.ADAPTER_CACHE_DIR
    log = tmp_path / "worker.log"
    worker = start_worker(
        log,
        AWS_S3_ENDPOINT_URL=proxy.url,
        AWS_MAX_ATTEMPTS="1",
        CELERY_BROKER_URL=private_redis.url,
        CELERY_RESULT_BACKEND="",
        LORAPLEX_TASK_RETRIES="2",
        LORAPLEX_TASK_RETRY_BACKOFF_SECONDS="0.2",
    )
    try:
        # Connections die mid-way through the weights, twice; the third attempt gets through.
        proxy.set("cut", cut_after=5000, cut_connections=2, cuts=0)
        publish(private_redis.url, queue.STAGE, flaky.pk)
        wait_for(lambda: staged_folders(cache), what="staging after two cuts")
        assert proxy.cuts == 2 and log.read_text().count("Retry in") == 2
        assert_staged_intact(cache, flaky)

        # Every connection dies: three attempts, then the task gives up.
        proxy.set("cut", cut_after=5000, cut_connections=None, cuts=0)
        publish(private_redis.url, queue.STAGE, down.pk)
        wait_for(
            lambda: f"{queue.STAGE}[" in log.read_text() and " raised " in log.read_text(),
            what="the task to give up",
        )
        assert proxy.cuts >= 3
        assert "StorageUnavailable" in log.read_text()
    finally:
        stop(worker)
    # Nothing half-written anywhere, and the version is still ready: the serving path's
    # cache miss stages it once storage answers again.
    assert staged_folders(cache) == [flaky.uid.hex]
    assert [p.name for p in cache.iterdir() if p.name.startswith(".")] == []
    down.refresh_from_db()
    assert down.status == "ready"
    proxy.set("pass")
    assert ensure_staged(down) == cache / down.uid.hex
    assert_staged_intact(cache, down)


@pytest.mark.parametrize("side", ["source bucket", "deployment's bucket"])
def test_storage_failing_mid_import_is_503_and_stores_nothing(
    db, s3, proxy, settings, monkeypatch, adapter, alice, user_client, good_adapter_dir, side
):
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    training = s3.create_bucket(f"training-{s3.bucket}")
    settings.S3_IMPORT_BUCKETS = [training]
    adapter.tenant.s3_import_prefixes = f"s3://{training}/"  # as an operator allows it
    adapter.tenant.save()
    s3.put_folder(training, "run/", good_adapter_dir)
    if side == "source bucket":
        settings.S3_IMPORT_ENDPOINT_URL = proxy.url
    else:
        options = {**settings.STORAGES["default"]["OPTIONS"], "endpoint_url": proxy.url}
        settings.STORAGES = {
            **settings.STORAGES,
            "default": {**settings.STORAGES["default"], "OPTIONS": options},
        }
    # The small config gets through; the connection dies in the middle of the weights.
    proxy.set("cut", cut_after=5000)

    response = user_client(alice).post(
        "/api/v1/adapters/support-bot/versions/", {"source": f"s3://{training}/run/"}, format="json"
    )
    assert response.status_code == 503, response.content
    error = response.json()["error"]
    assert error["code"] == "storage_unavailable"
    assert "adapter_model.safetensors" in error["message"] and proxy.cuts >= 1
    assert "127.0.0.1" not in error["message"]
    assert AdapterVersion.objects.count() == 0
    assert not AuditEvent.objects.filter(verb="version.upload").exists()
    assert s3.client.list_objects_v2(Bucket=s3.bucket).get("KeyCount") == 0
