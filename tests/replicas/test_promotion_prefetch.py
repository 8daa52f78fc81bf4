"""Tiered storage per replica: two `serve` replicas with their own adapter cache folders hear
through Redis that a version became ready and that an alias moved to it. Only the replica
that served the adapter (the one the router sends it to) stages the new version to its disk,
in the background; the other one, which never served it, leaves it alone. The first request
after the promotion (through the router) then loads it from local disk, not from object
storage, per the serving replica's /metrics."""

from __future__ import annotations

import pytest
import redis
from django.conf import settings

from registry.announcements import CHANNEL
from registry.staging import PREFETCHED_SUFFIX
from tests.waiting import wait_for

from .cluster import Cluster, Replica, start_cluster
from .conftest import BASE_NAME, TENANT, make_adapter, redis_required, upload_ready

pytestmark = pytest.mark.django_db


def listeners() -> int:
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        return int(dict(client.pubsub_numsub(CHANNEL)).get(CHANNEL.encode(), 0))
    finally:
        client.close()


def ask(cluster: Cluster, model: str) -> None:
    answer = cluster.openai().chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=2, timeout=60
    )
    assert answer.choices[0].message.content is not None
    # the bounded loads count requests in flight: the next one gets the hash's first choice
    wait_for(lambda: cluster.router.sessions() == 0, what="the request leaving the router")


def served_by(cluster: Cluster, adapter: str) -> tuple[Replica, Replica]:
    """(the replica whose engine holds `adapter`, the other one)."""
    prefix = f"{TENANT}/{adapter}:"
    first, second = cluster.replicas
    if any(n.startswith(prefix) for n in first.loaded_adapters()):
        return first, second
    assert any(n.startswith(prefix) for n in second.loaded_adapters()), "nobody served it"
    return second, first


@pytest.fixture(scope="module")
def promoted(replica_data, django_db_blocker):
    """Two replicas listening; `promo` version 1 served once through the router, then a
    version 2 made ready and aliased `production` (committed, as the control plane does it):
    (cluster, version 2, the replica that served `promo`, the other)."""
    from registry.services.adapters import adapter_create
    from registry.services.aliases import alias_set
    from tenants.models import Tenant

    redis_required()
    cluster = start_cluster(replica_data, ["p1", "p2"])
    try:
        wait_for(lambda: listeners() >= 2, what="both replicas subscribing")
        with django_db_blocker.unblock():
            tenant = Tenant.objects.get(slug=TENANT)
            adapter = adapter_create(tenant=tenant, name="promo", actor="test")
            first = upload_ready(adapter, promo_folder(replica_data, seed=98))
            alias_set(adapter=adapter, name="production", version_number=first.number, actor="t")
        ask(cluster, "promo")
        server, other = served_by(cluster, "promo")
        with django_db_blocker.unblock():
            version = upload_ready(adapter, promo_folder(replica_data, seed=99))  # announced
            alias_set(
                adapter=adapter, name="production", version_number=version.number, actor="test"
            )
        yield cluster, version, server, other
    finally:
        cluster.stop()


def promo_folder(replica_data, *, seed: int):
    out = replica_data.tmp / f"promo-{seed}"
    return make_adapter(replica_data.base_dir, out, seed=seed, base_name=BASE_NAME)


def cache(replica_data, replica: Replica):
    return replica_data.tmp / f"cache-{replica.name}"


def test_only_the_replica_that_served_the_adapter_stages_its_promotion(promoted, replica_data):
    cluster, version, server, other = promoted
    uid = version.uid.hex
    wait_for(lambda: (cache(replica_data, server) / uid).is_dir(), what="staging on its disk")
    wait_for(
        lambda: f"not staging {uid}" in other.log.read_text(),
        what="the other replica hearing of the promotion",
    )
    assert not (cache(replica_data, other) / uid).exists()
    assert (cache(replica_data, server) / f"{uid}{PREFETCHED_SUFFIX}").exists()  # not served yet


def test_the_first_request_after_the_promotion_loads_from_local_disk(promoted, replica_data):
    cluster, version, server, other = promoted
    wait_for(lambda: (cache(replica_data, server) / version.uid.hex).is_dir(), what="staging")
    before = server.metrics()[1]
    ask(cluster, "promo@production")
    after = {r.name: r.metrics()[1] for r in cluster.replicas}

    def hits(tiers: dict, tier: str) -> float:
        return tiers.get(tier, {}).get("hits", 0)

    assert hits(after[server.name], "disk") == hits(before, "disk") + 1, after
    assert hits(after[server.name], "loader") == hits(before, "loader"), after  # no fetch
    assert not any(c.get("lookups") for c in after[other.name].values()), after  # not asked
