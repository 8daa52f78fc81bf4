"""What the server's host side costs per request and per streamed token, on the emulated GPU:
the CPU time of the `serve` process (every thread) while a burst of requests is admitted and
while it streams, and the TTFT of the burst.

    .venv/bin/python bench/host_overhead.py [--burst 128] [--max-tokens 256] [--rounds 2]
        [--deployment llama-3-8b@h100]

The platform is set up as bench/emulated_serving.py sets it (SmolLM2's tokenizer, 8 real
adapters over 3 tenants, every per-tenant limit lifted). Each round: --burst streaming chat
requests sent together with `max_tokens: 1` (admission: the server's CPU per request, and
their TTFT p50/p99), then --burst sent together with --max-tokens each (streaming: TTFT
p50 while the burst streams, and the server's CPU per streamed token beyond what admitting
them cost). The server's CPU comes from /proc (utime + stime of its process); the clients'
own CPU is reported beside it (they share the machine's cores). Figures are medians over
--rounds. The last line is one JSON object.
"""

import asyncio
import json
import os
import random
import resource
import statistics
import tempfile
import time
from pathlib import Path

from common import bench_parser, model_dir, percentile
from emulated_serving import emulated_env, parse_deployments
from load import PROMPTS, setup_platform, start_server, timed_stream

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of a process, all its threads, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def burst(url: str, workload, n: int, max_tokens: int, seed: int):
    import httpx

    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=2 * n, max_keepalive_connections=2 * n)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:

        async def one():
            key, model, _folder, _system = rng.choice(workload)
            return await timed_stream(client, url, key, model, max_tokens, rng.choice(PROMPTS))

        results = await asyncio.gather(*(one() for _ in range(n)), return_exceptions=True)
    errors = [str(r)[:200] for r in results if isinstance(r, BaseException)]
    done = [r for r in results if not isinstance(r, BaseException)]
    return [ttft for ttft, _, _ in done], sum(tokens for _, _, tokens in done), errors


def measured(pid: int, url, workload, n: int, max_tokens: int, seed: int) -> dict:
    server0, client0, start = process_cpu_seconds(pid), own_cpu_seconds(), time.perf_counter()
    ttfts, tokens, errors = asyncio.run(burst(url, workload, n, max_tokens, seed))
    return {
        "wall_s": time.perf_counter() - start,
        "server_cpu_s": process_cpu_seconds(pid) - server0,
        "client_cpu_s": own_cpu_seconds() - client0,
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p99_s": percentile(ttfts, 99),
        "tokens": tokens,
        "errors": errors,
    }


def main():
    parser = bench_parser(__doc__, burst=128, max_tokens=256, rounds=2, adapters=8, tenants=3)
    parser.add_argument("--deployment", default="llama-3-8b@h100")
    args = parser.parse_args()
    deployment = parse_deployments(args.deployment)[0]
    var_dir = Path(tempfile.mkdtemp(prefix="loraplex-host-"))
    workload, _cold = setup_platform(var_dir, model_dir(args.model).resolve(), args.adapters,
                                     args.tenants)  # fmt: skip
    url, proc = start_server(emulated_env(deployment, args.burst))
    admitted, streamed = [], []
    try:
        asyncio.run(burst(url, workload, 8, 4, seed=99))  # adapters warm, paths compiled
        for r in range(args.rounds):
            admitted.append(measured(proc.pid, url, workload, args.burst, 1, seed=r))
            streamed.append(measured(proc.pid, url, workload, args.burst, args.max_tokens, r))
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    per_request = statistics.median(a["server_cpu_s"] / args.burst for a in admitted)
    per_token = statistics.median(
        (s["server_cpu_s"] - per_request * args.burst) / max(s["tokens"], 1) for s in streamed
    )
    out = {
        "deployment": args.deployment,
        "burst": args.burst,
        "max_tokens": args.max_tokens,
        "server_cpu_ms_per_request": round(1000 * per_request, 2),
        "server_cpu_us_per_token": round(1e6 * per_token, 1),
        "admission_ttft_p50_s": round(statistics.median(a["ttft_p50_s"] for a in admitted), 3),
        "admission_ttft_p99_s": round(statistics.median(a["ttft_p99_s"] for a in admitted), 3),
        "streaming_ttft_p50_s": round(statistics.median(s["ttft_p50_s"] for s in streamed), 3),
        "client_cpu_share": round(
            sum(x["client_cpu_s"] for x in admitted + streamed)
            / sum(x["wall_s"] for x in admitted + streamed), 2),
        "errors": sum(len(x["errors"]) for x in admitted + streamed),
        "error_samples": sorted({e for x in admitted + streamed for e in x["errors"]})[:3],
    }  # fmt: skip
    print(json.dumps(out))


if __name__ == "__main__":
    main()
