"""A real worker process consumes from the configured broker; CI proves it is PostgreSQL + Redis."""

import os

import pytest
from django.conf import settings
from django.db import connection

from platform_site.tasks import ping


def test_a_real_worker_runs_a_task_through_the_broker(live_worker):
    result = ping.apply_async().get(timeout=30)
    assert result["pong"] is True


@pytest.mark.skipif(
    os.environ.get("LORAPLEX_REQUIRE_SERVICES") != "1", reason="CI only: needs PostgreSQL and Redis"
)
def test_ci_runs_on_postgresql_and_redis(live_worker):
    assert connection.vendor == "postgresql"
    assert settings.CELERY_BROKER_URL.startswith("redis://")
    import redis

    assert redis.Redis.from_url(settings.CELERY_BROKER_URL).ping()
    assert ping.apply_async().get(timeout=30)["pong"] is True
