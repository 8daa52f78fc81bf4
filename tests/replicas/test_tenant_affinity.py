"""Two tenants with same-named adapters behind two `serve` replicas and the shipped HAProxy
config: the router's affinity key is the caller's API key prefix with the adapter, so the
tenants' namesakes are spread over the replicas, while each tenant's adapter stays on one
replica whatever name (alias, version number) it is asked by.

The keys' prefixes and the names are chosen, so the hash places them the same on every run;
each request waits for the one before to leave the router, so the bounded loads never move
one (they count requests in flight).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.waiting import wait_for

from .cluster import Cluster, start_cluster
from .conftest import BASE_NAME, api_key_with_prefix, make_adapter, upload_ready

pytestmark = pytest.mark.django_db
TENANTS = {"replicas-route-a": "a0a0a0a0a0a1", "replicas-route-b": "b0b0b0b0b0b2"}
NAMES = ("support-bot", "summarizer", "triage", "translator")


def drop_tenants(django_db_blocker) -> None:
    from registry.models import Adapter, Alias
    from tenants.models import Tenant

    with django_db_blocker.unblock():
        Alias.objects.filter(adapter__tenant__slug__in=TENANTS).delete()
        Adapter.objects.filter(tenant__slug__in=TENANTS).delete()
        Tenant.objects.filter(slug__in=TENANTS).delete()


@pytest.fixture(scope="module")
def keys(replica_data, django_db_blocker) -> Iterator[dict[str, str]]:
    """Each tenant's key; each tenant has every name in NAMES, its version 1 `production`."""
    from registry.services.adapters import adapter_create
    from registry.services.aliases import alias_set
    from tenants.services import tenant_create

    drop_tenants(django_db_blocker)
    found: dict[str, str] = {}
    with django_db_blocker.unblock():
        for t, (slug, prefix) in enumerate(TENANTS.items()):
            tenant = tenant_create(slug=slug, name=slug)
            found[slug] = api_key_with_prefix(tenant, prefix)
            for n, name in enumerate(NAMES):
                folder = replica_data.tmp / f"{slug}-{name}"
                make_adapter(
                    replica_data.base_dir, folder, seed=100 + 10 * t + n, base_name=BASE_NAME
                )
                adapter = adapter_create(tenant=tenant, name=name, actor="test")
                version = upload_ready(adapter, folder)
                alias_set(
                    adapter=adapter, name="production", version_number=version.number, actor="test"
                )
    yield found
    drop_tenants(django_db_blocker)


@pytest.fixture(scope="module")
def cluster(replica_data, keys):
    cluster = start_cluster(replica_data, ["t1", "t2"])
    yield cluster
    cluster.stop()


def ask(cluster: Cluster, key: str, model: str) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{cluster.router.url}/v1", api_key=key, max_retries=0)
    answer = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=2, timeout=60
    )
    assert answer.choices[0].finish_reason in ("stop", "length")
    wait_for(lambda: cluster.router.sessions() == 0, what="the request leaving the router")


def holders(cluster: Cluster, slug: str, name: str) -> list[str]:
    """The replicas whose engine holds this tenant's adapter (any version)."""
    return [
        r.name
        for r in cluster.replicas
        if any(n.startswith(f"{slug}/{name}:") for n in r.loaded_adapters())
    ]


def test_two_tenants_same_named_adapters_are_spread_by_the_key(cluster, keys):
    for _ in range(2):
        for name in NAMES:
            for key in keys.values():
                ask(cluster, key, name)
    placed = {(slug, name): holders(cluster, slug, name) for slug in keys for name in NAMES}
    assert all(len(where) == 1 for where in placed.values()), placed  # none loaded twice
    a, b = TENANTS
    apart = [name for name in NAMES if placed[a, name] != placed[b, name]]
    assert apart, f"every pair of namesakes shares a replica: {placed}"


def test_one_tenants_adapter_stays_on_one_replica_by_every_name(cluster, keys):
    slug, key = next(iter(keys.items()))
    name = NAMES[0]
    before = sum(r.loads() for r in cluster.replicas)
    for model in (name, f"{name}@production", f"{name}:1", name, f"{name}@production"):
        ask(cluster, key, model)
    assert len(holders(cluster, slug, name)) == 1
    assert sum(r.loads() for r in cluster.replicas) - before <= 1  # one load at most, once
