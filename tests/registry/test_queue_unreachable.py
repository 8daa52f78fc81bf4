"""A broker that cannot be reached when a change commits (Redis restarting, a network cut):
the caller's upload or promotion is accepted, nothing is lost (the sweep queues the
validation again), and the wait is short; tasks nothing else makes good still fail loudly."""

import logging
import time
from datetime import timedelta

import pytest
from django.utils import timezone
from kombu.exceptions import OperationalError

from registry import queue
from registry.models import AdapterVersion
from registry.services.versions import versions_sweep_stuck
from tests.processes import free_port
from tests.registry.conftest import files_of, make_ready_version

pytestmark = pytest.mark.django_db

VERSIONS = "/api/v1/adapters/support-bot/versions/"


@pytest.fixture
def unreachable_broker(monkeypatch):
    """The Celery app pointed at a Redis port nothing listens on (its pool made anew)."""
    from platform_site.celery import app

    url = f"redis://127.0.0.1:{free_port()}/0"
    for name in ("broker_url", "broker_write_url", "broker_read_url"):
        monkeypatch.setattr(app.conf, name, url)
    monkeypatch.setattr(app, "_pool", None)
    monkeypatch.setattr(app.amqp, "_producer_pool", None)


def test_an_upload_is_accepted_and_its_validation_queued_again_by_the_sweep(
    unreachable_broker,
    adapter,
    alice,
    user_client,
    good_adapter_dir,
    caplog,
    django_capture_on_commit_callbacks,
    settings,
):
    started = time.monotonic()
    with (
        caplog.at_level(logging.WARNING, "registry.queue"),
        django_capture_on_commit_callbacks(execute=True),
    ):
        response = user_client(alice).post(VERSIONS, files_of(good_adapter_dir), format="multipart")
    assert response.status_code == 202, response.content
    assert time.monotonic() - started < 30  # tries, not the result backend's long retries
    version = AdapterVersion.objects.get()
    assert version.status == "pending"
    (warning,) = [r for r in caplog.records if r.name == "registry.queue"]
    assert f"could not queue {queue.VALIDATE}({version.pk},)" in warning.getMessage()

    later = timezone.now() + timedelta(seconds=settings.VALIDATION_DEADLINE_SECONDS + 1)
    with django_capture_on_commit_callbacks(execute=True):
        counts = versions_sweep_stuck(now=later)
    assert counts["requeued"] == 1  # its message lost: queued again (here, lost again)


def test_a_promotion_is_accepted_and_the_engine_stages_on_its_miss(
    unreachable_broker,
    adapter,
    alice,
    user_client,
    good_adapter_dir,
    django_capture_on_commit_callbacks,
):
    version = make_ready_version(adapter, good_adapter_dir)
    with django_capture_on_commit_callbacks(execute=True):
        response = user_client(alice).put(
            "/api/v1/adapters/support-bot/aliases/production/",
            {"version": version.number},
            format="json",
        )
    assert response.status_code in (200, 201), response.content


def test_a_task_nothing_else_makes_good_still_fails_to_its_caller(unreachable_broker):
    with pytest.raises(OperationalError):
        queue.send(queue.RECHECK, 1)
