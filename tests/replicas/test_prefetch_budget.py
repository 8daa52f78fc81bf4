"""One replica's prefetcher in this process, its engine stood in for by the set of what it
has served: a version is staged only for an adapter the engine served, and copies staged
ahead of a request stay within LORAPLEX_PREFETCH_BYTES, the never-served ones evicted first
(oldest first), before the cache's own LRU would drop a served copy."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from django.test import override_settings

from inference.host.prefetch import Prefetcher, Served
from registry.model_names import version_name
from registry.staging import PREFETCHED_SUFFIX, ensure_staged

from .conftest import BASE_NAME, make_adapter, upload_ready

pytestmark = pytest.mark.django_db


class InProcess(Prefetcher):
    """In the test's transaction: no fresh connections, and a failure fails the test."""

    @staticmethod
    def _with_db(work):
        return work()


@dataclass
class Engine:
    """What `engine_served` reads from the engine: the versions it has loaded."""

    loaded: list = field(default_factory=list)

    def served(self) -> Served:
        return Served(
            adapters=frozenset(version_name(v).rpartition(":")[0] for v in self.loaded),
            versions=frozenset(v.uid.hex for v in self.loaded),
        )


@pytest.fixture(scope="module")
def versions(replica_data, django_db_blocker):
    """adapter name -> [its version 1 (from replica_data), a version 2 (ready)]."""
    from registry.models import Adapter, AdapterVersion

    found = {}
    with django_db_blocker.unblock():
        for i, name in enumerate(replica_data.adapters[:7]):
            adapter = Adapter.objects.get(name=name, tenant__slug="replicas-a")
            folder = make_adapter(
                replica_data.base_dir, replica_data.tmp / f"{name}-v2", seed=50 + i,
                base_name=BASE_NAME,
            )  # fmt: skip
            first = AdapterVersion.objects.select_related("adapter__tenant").get(
                adapter=adapter, number=1
            )
            found[name] = [first, upload_ready(adapter, folder)]
    return found


def size(version) -> int:
    return version.config_size + version.weights_size


def on_disk(cache, version) -> bool:
    return (cache / version.uid.hex).is_dir()


def marked(cache, version) -> bool:
    return (cache / f"{version.uid.hex}{PREFETCHED_SUFFIX}").exists()


@pytest.fixture
def cache(tmp_path):
    with override_settings(ADAPTER_CACHE_DIR=tmp_path):
        yield tmp_path


def test_only_an_adapter_the_engine_served_is_prefetched(cache, versions):
    r00, r01 = versions["r00"], versions["r01"]
    engine = Engine(loaded=[r00[0]])
    prefetcher = InProcess(BASE_NAME, served=engine.served, budget=10 * size(r00[1]))
    assert not prefetcher.prefetch(uid=r01[1].uid.hex)  # r01: never served here
    assert not on_disk(cache, r01[1]) and prefetcher.skipped == 1
    assert prefetcher.prefetch(uid=r00[1].uid.hex)
    assert on_disk(cache, r00[1]) and marked(cache, r00[1])


def test_the_budget_evicts_never_served_copies_first(cache, versions):
    r00, r01, r02, r03 = (versions[f"r0{i}"] for i in range(4))
    engine = Engine(loaded=[r00[0], r01[0], r02[0], r03[0]])
    prefetcher = InProcess(BASE_NAME, served=engine.served, budget=2 * size(r00[1]) + 100)
    assert prefetcher.prefetch(uid=r00[1].uid.hex)
    assert prefetcher.prefetch(uid=r01[1].uid.hex)
    engine.loaded.append(r00[1])  # a request used the prefetched r00 v2
    assert prefetcher.prefetch(uid=r02[1].uid.hex)  # r01 v2 and r02 v2 fill the budget
    assert all(on_disk(cache, v[1]) for v in (r00, r01, r02))
    assert not marked(cache, r00[1])  # served: the cache's LRU keeps it from now on

    assert prefetcher.prefetch(uid=r03[1].uid.hex)
    assert not on_disk(cache, r01[1]) and not marked(cache, r01[1])  # oldest never served
    assert on_disk(cache, r00[1])  # older, but served
    assert on_disk(cache, r02[1]) and on_disk(cache, r03[1])


def test_prefetched_copies_go_before_served_ones_when_the_cache_is_full(cache, versions):
    r04, r05, r06 = versions["r04"], versions["r05"], versions["r06"]
    engine = Engine(loaded=[r04[0], r05[0], r06[0]])
    one = size(r04[0])
    with override_settings(ADAPTER_CACHE_BYTES=3 * one + 100):
        ensure_staged(r04[0])  # the loader's copies, for requests: the oldest
        ensure_staged(r05[0])
        prefetcher = InProcess(BASE_NAME, served=engine.served, budget=3 * one + 100)
        assert prefetcher.prefetch(uid=r05[1].uid.hex)  # the cache is full
        assert prefetcher.prefetch(uid=r06[1].uid.hex)
    assert not on_disk(cache, r05[1])  # the never-served copy made the room
    assert on_disk(cache, r04[0]) and on_disk(cache, r05[0]) and on_disk(cache, r06[1])
