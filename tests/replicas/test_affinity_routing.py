"""Two `serve` replicas behind HAProxy (the shipped docker/haproxy.cfg) on loopback, sharing
PostgreSQL, Redis and the object store: each adapter is loaded on one replica only, a burst
on one adapter spills to the other, SIGTERM under traffic fails no request, and after a
SIGKILL the health checks take the dead replica out and every request succeeds again.

The tests run in order on one cluster: the failover tests change it.
"""

from __future__ import annotations

import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.test import override_settings

from registry import engines
from tests.waiting import wait_for

from .cluster import Cluster, Replica, start_cluster
from .conftest import OPERATOR_TOKEN, TENANT, start_replica
from .router import CHECK_INTERVAL_SECONDS, Router

pytestmark = pytest.mark.django_db
BURST = 8  # concurrent requests on one adapter: beyond 150% of the average load on 2 replicas


@pytest.fixture(scope="module")
def cluster(replica_data):
    cluster = start_cluster(replica_data, ["r1", "r2"])
    yield cluster
    cluster.stop()


def ask(cluster: Cluster, model: str, *, max_tokens: int = 2) -> str:
    answer = cluster.openai().chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=max_tokens,
        temperature=0,
        timeout=60,
    )
    assert answer.choices[0].finish_reason in ("stop", "length")
    return answer.id


def holders(cluster: Cluster, adapter: str) -> list[str]:
    """The replicas whose engine holds `adapter` (any version)."""
    prefix = f"{TENANT}/{adapter}:"
    return [
        r.name
        for r in cluster.replicas
        if r.proc.poll() is None and any(n.startswith(prefix) for n in r.loaded_adapters())
    ]


def test_each_adapter_is_loaded_on_exactly_one_replica(cluster):
    adapters = cluster.data.adapters
    for _ in range(2):
        for model in adapters:
            ask(cluster, model)
    loads = {r.name: r.loads() for r in cluster.replicas}
    assert sum(loads.values()) == len(adapters), loads  # none loaded twice
    assert all(loads.values()), f"one replica got every adapter: {loads}"
    held = {r.name: 0 for r in cluster.replicas}
    for model in adapters:
        (holder,) = holders(cluster, model)
        held[holder] += 1
    assert held == loads  # each replica's loads are the adapters it holds (no eviction here)


def test_operators_reach_every_replica_through_one_dns_name(cluster):
    """`dns+http://localhost:<port>` lists every address the name resolves to: with compose's
    `dns+http://engine:8000`, the Engines page and pins cover each replica."""
    port = cluster.replicas[0].address.rsplit(":", 1)[1]
    with override_settings(ENGINE_URLS=[f"dns+http://localhost:{port}"]):
        assert f"http://127.0.0.1:{port}" in engines.engine_urls()
    urls = [r.url for r in cluster.replicas]
    with override_settings(ENGINE_URLS=urls, OPERATOR_TOKEN=OPERATOR_TOKEN):
        name = f"{TENANT}/{cluster.data.adapters[0]}"
        results = engines.set_pinned(name, pinned=True)
        assert [r.ok for r in results] == [True, True], results
        states = [engines.engine_state(url) for url in urls]
        assert all(not s.errors for s in states), [s.errors for s in states]
        for state in states:
            pinned = [
                a for rows in state.adapters_by_tier.values() for a in rows if a.get("pinned")
            ]
            assert [a["name"].split(":")[0] for a in pinned] == [name]
        assert all(r.ok for r in engines.set_pinned(name, pinned=False))


def test_a_burst_on_one_adapter_spills_to_the_other_replica(cluster):
    model = cluster.data.adapters[1]
    assert len(holders(cluster, model)) == 1
    with ThreadPoolExecutor(BURST) as pool:
        list(pool.map(lambda _: ask(cluster, model, max_tokens=48), range(BURST)))
    assert len(holders(cluster, model)) == 2, "the burst stayed on one replica"


class Traffic:
    """Requests in a loop from a few threads until stopped; every failure is kept."""

    def __init__(self, cluster: Cluster, threads: int = 3):
        self.cluster = cluster
        self.done = threading.Event()
        self.ok = 0
        self.failures: list[str] = []
        self.threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)
        ]

    def _run(self, index: int) -> None:
        adapters = self.cluster.data.adapters
        i = index
        while not self.done.is_set():
            try:
                ask(self.cluster, adapters[i % len(adapters)], max_tokens=16)
                self.ok += 1
            except Exception as exc:  # noqa: BLE001 (every failure is the finding)
                self.failures.append(f"{type(exc).__name__}: {exc}")
            i += 3

    def __enter__(self) -> Traffic:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        for thread in self.threads:
            thread.join(timeout=120)


def test_sigkill_takes_the_replica_out_after_the_health_checks(cluster):
    dead = cluster.replicas[0]
    dead.signal(signal.SIGKILL)
    dead.proc.wait(timeout=10)
    # `fall 2`: two failed checks, `inter` apart, and two intervals to spare
    wait_for(
        lambda: cluster.router.servers_up() == 1,
        timeout=CHECK_INTERVAL_SECONDS * 4,
        what="the health checks taking the killed replica out",
    )
    for model in cluster.data.adapters:  # the dead replica's adapters moved to the other
        ask(cluster, model)
    assert all(holders(cluster, m) == ["r2"] for m in cluster.data.adapters)


def test_sigterm_under_traffic_fails_no_request(cluster, replica_data):
    url, proc, log = start_replica(replica_data, "r3")  # the supervisor's replacement
    replacement = Replica("r3", url, proc, log)
    cluster.replicas.append(replacement)
    cluster.router.stop()
    servers = {r.name: r.address for r in cluster.replicas[1:]}
    cluster.router = Router(replica_data.tmp, servers).start()
    draining = cluster.replicas[1]
    with Traffic(cluster) as traffic:
        wait_for(lambda: traffic.ok >= 6, what="traffic flowing")
        # the signal lands while the replica is in the middle of requests
        wait_for(
            lambda: draining.metrics()[0].get("loraplex_requests_running", 0) >= 1,
            what="a request running on the replica about to drain",
        )
        before = traffic.ok
        draining.signal(signal.SIGTERM)
        # uvicorn drains, then re-raises the signal: killed by SIGTERM, after the drain
        assert draining.proc.wait(timeout=60) in (0, -signal.SIGTERM)
        time.sleep(3)
    assert not traffic.failures, traffic.failures[:5]
    assert traffic.ok > before > 0
    assert cluster.router.servers_up() == 1
