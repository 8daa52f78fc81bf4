"""Several `serve` replicas behind the shipped HAProxy config, and what each one reports."""

from __future__ import annotations

import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from registry.engines import parse_metrics
from tests.inference.conftest import stop_server

from .conftest import OPERATOR_TOKEN, ReplicaData, start_replica
from .router import Router


@dataclass
class Replica:
    name: str
    url: str
    proc: subprocess.Popen
    log: Path

    @property
    def address(self) -> str:
        return self.url.removeprefix("http://")

    def metrics(self) -> tuple[dict[str, float], dict[str, dict]]:
        """Unlabelled samples, and adapter lookups and hits per tier (`disk`: read from this
        replica's local cache; `loader`: staged from object storage first)."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        return parse_metrics(text)

    def loads(self) -> float:
        return self.metrics()[0].get("loraplex_lora_loads_total", 0.0)

    def loaded_adapters(self) -> set[str]:
        """Names the engine holds in any tier (the operator's listing)."""
        headers = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
        answer = httpx.get(f"{self.url}/v1/lora_adapters", headers=headers, timeout=10)
        answer.raise_for_status()
        return {item["name"] for item in answer.json()["data"]}

    def signal(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)


@dataclass
class Cluster:
    data: ReplicaData
    replicas: list[Replica]
    router: Router
    extra_env: dict[str, str] = field(default_factory=dict)

    def openai(self):
        from openai import OpenAI

        return OpenAI(base_url=f"{self.router.url}/v1", api_key=self.data.key, max_retries=0)

    def stop(self) -> None:
        self.router.stop()
        for replica in self.replicas:
            if replica.proc.poll() is None:
                stop_server(replica.proc)


def start_cluster(
    data: ReplicaData, names: list[str], *, balance: str | None = None, **extra: str
) -> Cluster:
    replicas: list[Replica] = []
    try:
        for name in names:
            url, proc, log = start_replica(data, name, **extra)
            replicas.append(Replica(name, url, proc, log))
        servers = {r.name: r.address for r in replicas}
        router = Router(data.tmp, servers, balance=balance).start()
    except BaseException:
        for replica in replicas:
            stop_server(replica.proc)
        raise
    return Cluster(data, replicas, router, dict(extra))
