"""Adapter-affinity routing vs round robin: two `serve` replicas behind HAProxy, one Zipf run.

    .venv/bin/python bench/replicas.py [--model DIR] [--adapters 60] [--requests 600]
        [--clients 4] [--zipf 1.1] [--max-loras 4] [--max-cpu-loras 8] [--max-tokens 8]

Everything runs in a throwaway var dir (SQLite, local object store, no Redis; rate limits
off): SmolLM2 (or --model) and --adapters rank-16 adapters over 2 tenants, each staged to
local disk before either run, so every load in both runs is the same disk -> host load. The
same seeded Zipf sequence of requests over the adapters (popularity shuffled, unrelated to
the names' hashes) goes through the shipped docker/haproxy.cfg twice, each time to two fresh
replicas, from --clients concurrent streaming clients: once with its consistent hashing of
the caller's key prefix and the adapter (bounded loads), once with `balance roundrobin`.
Each replica holds --max-loras adapters in device slots and --max-cpu-loras in host memory
(LRU), so a replica that sees every adapter keeps reloading them, and half the CPU cores
(OMP_NUM_THREADS). Reported per policy: adapter loads summed over both replicas' /metrics,
and TTFT p50/p99 (to the first chunk with content). Goal: affinity at most 0.6 of round
robin's loads, and a lower p99. The last line printed is one JSON object of the figures.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common import bench_parser, model_dir, percentile
from load import setup_platform, start_server

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def zipf_sequence(n_adapters: int, n_requests: int, s: float, seed: int = 0) -> list[int]:
    weights = [1 / (rank + 1) ** s for rank in range(n_adapters)]
    order = list(range(n_adapters))
    random.Random(seed).shuffle(order)  # popularity unrelated to the name's hash
    return random.Random(seed + 1).choices(order, weights=weights, k=n_requests)


def replica_figures(url: str) -> dict:
    """Loads and per-tier hits from a replica's /metrics."""
    import httpx

    from registry.engines import parse_metrics

    plain, tiers = parse_metrics(httpx.get(f"{url}/metrics", timeout=10).text)
    return {
        "loads": plain.get("loraplex_lora_loads_total", 0.0),
        "hits": {tier: counts.get("hits", 0.0) for tier, counts in sorted(tiers.items())},
    }


def ttft(router_url: str, key: str, model: str, max_tokens: int) -> float:
    """Seconds from sending a streaming chat request to its first chunk with content (the
    role chunk that opens the stream comes before any work)."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{router_url}/v1", api_key=key, max_retries=0, timeout=300)
    start = time.perf_counter()
    first = None
    for chunk in client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Say something short."}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
    ):
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - start
    return first if first is not None else time.perf_counter() - start


def run_policy(balance: str | None, jobs: list[tuple[str, str]], env: dict, tmp: Path, args):
    from tests.replicas.router import Router

    replicas = [start_server(env) for _ in range(2)]
    servers = {f"r{i}": url.removeprefix("http://") for i, (url, _) in enumerate(replicas)}
    router = Router(tmp, servers, balance=balance).start()
    errors: list[str] = []

    def one(job: tuple[str, str]) -> float | None:
        try:
            return ttft(router.url, job[0], job[1], args.max_tokens)
        except Exception as exc:  # counted: the goal is none
            errors.append(f"{type(exc).__name__}: {exc}"[:200])
            return None

    try:
        start = time.perf_counter()
        with ThreadPoolExecutor(args.clients) as pool:
            answered = list(pool.map(one, jobs))
        seconds = time.perf_counter() - start
        per_replica = [replica_figures(url) for url, _ in replicas]
    finally:
        router.stop()
        for _, proc in replicas:
            proc.terminate()
            proc.wait(timeout=120)
    times = [t for t in answered if t is not None]
    return {
        "loads": sum(r["loads"] for r in per_replica),
        "loads_per_replica": [r["loads"] for r in per_replica],
        "hits_per_replica": [r["hits"] for r in per_replica],
        "ttft_p50_ms": round(percentile(times, 50) * 1000, 1),
        "ttft_p99_ms": round(percentile(times, 99) * 1000, 1),
        "errors": len(errors),
        "first_errors": errors[:3],
        "seconds": round(seconds, 1),
    }


def main() -> None:
    parser = bench_parser(
        __doc__,
        adapters=60,
        requests=600,
        clients=4,
        zipf=1.1,
        max_loras=4,
        max_cpu_loras=8,
        max_tokens=8,
    )
    args = parser.parse_args()
    for name in ("REDIS_URL", "CELERY_BROKER_URL"):  # this run's own, throwaway services
        os.environ.pop(name, None)
    tmp = Path(tempfile.mkdtemp(prefix="loraplex-bench-replicas-"))
    try:
        run(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the adapters' copies: GBs


def run(args, tmp: Path) -> None:
    model = model_dir(args.model)
    workload, _ = setup_platform(tmp / "var", model, args.adapters, 2)
    logging.disable(logging.INFO)  # no log line per request from this process's clients
    from registry.models import AdapterVersion
    from registry.staging import ensure_staged

    for version in AdapterVersion.objects.filter(status=AdapterVersion.READY):
        ensure_staged(version)  # both runs load from local disk
    env = {
        **os.environ,
        # each replica its share of the cores, as each gets its own GPU in a deployment
        "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) // 2)),
        "LORAPLEX_ENGINE": "on",
        "LORAPLEX_MAX_LORAS": str(args.max_loras),
        "LORAPLEX_MAX_CPU_LORAS": str(args.max_cpu_loras),
        "LORAPLEX_RATE_LIMIT_RPM": "0",
        "LORAPLEX_RATE_LIMIT_TPM": "0",
    }
    sequence = zipf_sequence(len(workload), args.requests, args.zipf)
    jobs = [(workload[i][0], workload[i][1]) for i in sequence]
    runs: dict[str, dict] = {}
    for policy, balance in (("affinity", None), ("round_robin", "roundrobin")):
        runs[policy] = run_policy(balance, jobs, env, tmp, args)
        print(policy, json.dumps(runs[policy]), flush=True)
    affinity, rr = runs["affinity"], runs["round_robin"]
    ratio = affinity["loads"] / max(rr["loads"], 1)
    figures = {
        "model": model.name,
        "adapters": len(workload),
        "distinct_adapters_requested": len(set(sequence)),
        "requests": args.requests,
        "clients": args.clients,
        "zipf": args.zipf,
        "max_loras": args.max_loras,
        "max_cpu_loras": args.max_cpu_loras,
        "max_tokens": args.max_tokens,
        **runs,
        "load_ratio": round(ratio, 3),
        "ttft_p99_ratio": round(affinity["ttft_p99_ms"] / rr["ttft_p99_ms"], 3),
        "goal_met": ratio <= 0.6
        and affinity["ttft_p99_ms"] < rr["ttft_p99_ms"]
        and not (affinity["errors"] or rr["errors"]),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
