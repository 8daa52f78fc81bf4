"""Tiered storage per replica: two `serve` replicas with their own adapter cache folders hear
through Redis that a version became ready and that an alias moved to it, and each stages it
to its own disk in the background; the first request (through the router) then loads it
from local disk, not from object storage, per the serving replica's /metrics."""

from __future__ import annotations

import pytest
import redis
from django.conf import settings

from registry.announcements import CHANNEL
from tests.waiting import wait_for

from .cluster import start_cluster
from .conftest import BASE_NAME, TENANT, make_adapter, redis_required, upload_ready

pytestmark = pytest.mark.django_db


def listeners() -> int:
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        return int(dict(client.pubsub_numsub(CHANNEL)).get(CHANNEL.encode(), 0))
    finally:
        client.close()


@pytest.fixture(scope="module")
def promoted(replica_data, django_db_blocker):
    """Two replicas listening, then a new version made ready and aliased `production`
    (committed, as the control plane does it): (cluster, version)."""
    from registry.services.adapters import adapter_create
    from registry.services.aliases import alias_set
    from tenants.models import Tenant

    redis_required()
    cluster = start_cluster(replica_data, ["p1", "p2"])
    try:
        wait_for(lambda: listeners() >= 2, what="both replicas subscribing")
        folder = make_adapter(
            replica_data.base_dir, replica_data.tmp / "promo", seed=99, base_name=BASE_NAME
        )
        with django_db_blocker.unblock():
            tenant = Tenant.objects.get(slug=TENANT)
            adapter = adapter_create(tenant=tenant, name="promo", actor="test")
            version = upload_ready(adapter, folder)  # ready: announced after commit
            alias_set(
                adapter=adapter, name="production", version_number=version.number, actor="test"
            )
        yield cluster, version
    finally:
        cluster.stop()


def test_a_promoted_version_is_on_each_replicas_disk_before_its_first_request(
    promoted, replica_data
):
    cluster, version = promoted
    caches = [replica_data.tmp / f"cache-{r.name}" / version.uid.hex for r in cluster.replicas]
    wait_for(lambda: all(c.is_dir() for c in caches), what="staging on both disks")

    answer = cluster.openai().chat.completions.create(
        model="promo@production",
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=2,
        timeout=60,
    )
    assert answer.choices[0].message.content is not None
    hits = {r.name: r.metrics()[1] for r in cluster.replicas}
    served = [name for name, tiers in hits.items() if tiers.get("disk", {}).get("hits")]
    assert len(served) == 1, hits
    for tiers in hits.values():  # nobody fetched from object storage on the request's path
        assert not tiers.get("loader", {}).get("hits"), hits
