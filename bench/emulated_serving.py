"""`manage.py serve` on an emulated GPU under streaming clients: how busy the host keeps the
device, and what the clients see.

    .venv/bin/python bench/emulated_serving.py [--streams 64,256] [--seconds 30]
        [--max-tokens 128] [--adapters 8] [--deployments llama-3-8b@h100,llama-3-70b:fp8@h200]

The platform is set up as bench/load.py sets it (a throwaway var dir, SQLite, SmolLM2 as the
served tokenizer, real adapters over 3 tenants). For each deployment (model[:quantization]@
device) a server runs with LORAPLEX_EMULATE_*, and for each stream count that many clients
stream chat completions (each on a random adapter, ignore_eos, --max-tokens) for --seconds.
Figures per run: the device-busy fraction (the emulated device's busy seconds on /metrics
over the wall time), tokens/s and its share of what the device alone would give (the same
decode batch back to back: streams / the cost model's step time at that batch and the mean
context), TTFT and inter-token latency p50/p99, and the CPU the clients themselves took (they
share the machine's cores with the server). The last line is one JSON object of the figures.
"""

import asyncio
import json
import os
import resource
import tempfile
import time
from pathlib import Path

from common import bench_parser, model_dir, percentile
from load import PROMPTS, metric_total, setup_platform, start_server, timed_stream

ROOT = Path(__file__).resolve().parents[1]
BUSY = "loraplex_emulated_device_busy_seconds_total"


async def run_streams(url, workload, streams, seconds, max_tokens, seed=0):
    import random

    import httpx

    rng = random.Random(seed)
    ttfts, gaps, tokens, errors = [], [], 0, []
    deadline = time.perf_counter() + seconds

    async def client_loop(client):
        nonlocal tokens
        while time.perf_counter() < deadline:
            key, model, _folder, _system = rng.choice(workload)
            try:
                ttft, g, n = await timed_stream(
                    client, url, key, model, max_tokens, rng.choice(PROMPTS)
                )
            except Exception as exc:  # counted, never fatal: the goal is zero
                errors.append(str(exc)[:200])
                continue
            ttfts.append(ttft)
            gaps.extend(g)
            tokens += n

    limits = httpx.Limits(max_connections=streams * 2, max_keepalive_connections=streams * 2)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(streams)))
    return ttfts, gaps, tokens, errors


def ideal_tokens_per_s(deployment: dict, streams: int, context: int) -> float:
    """The emulated device alone: a decode batch of `streams` back to back."""
    from inference.engine.planning import PRESETS, device_named
    from inference.engine.planning.planner import model_config
    from inference.engine.planning.step_time import StepTimeModel

    mc = model_config(PRESETS[deployment["model"]])
    model = StepTimeModel(mc, device_named(deployment["device"]), deployment["quantization"])
    return streams / (model.decode_step_ms(streams, context) / 1000)


def emulated_env(deployment: dict, streams: int) -> dict[str, str]:
    """serve's environment for a deployment on the emulated device, with every per-tenant
    limit lifted (the load is the bench's own) and room for `streams` connections."""
    env = {
        **os.environ,
        "LORAPLEX_ENGINE": "on",
        "LORAPLEX_EMULATE_DEVICE": deployment["device"],
        "LORAPLEX_EMULATE_MODEL": deployment["model"],
        "LORAPLEX_EMULATE_QUANTIZATION": deployment["quantization"] or "",
        "LORAPLEX_MAX_NUM_SEQS": str(streams),
        "LORAPLEX_MAX_CONNECTIONS": str(2 * streams + 16),  # uvicorn's 503 beyond
        "LORAPLEX_MAX_LORAS": "8",
        "LORAPLEX_MAX_CPU_LORAS": "32",
        "LORAPLEX_RATE_LIMIT_RPM": "0",
        "LORAPLEX_RATE_LIMIT_TPM": "0",
        "LORAPLEX_TENANT_MAX_CONCURRENCY": "0",
        "LORAPLEX_TENANT_MAX_TOKENIZATIONS": "0",
    }
    if not deployment["quantization"]:
        env.pop("LORAPLEX_EMULATE_QUANTIZATION")
    return env


def parse_deployments(text: str) -> list[dict]:
    out = []
    for item in text.split(","):
        model, _, device = item.partition("@")
        model, _, quantization = model.partition(":")
        out.append({"model": model, "device": device, "quantization": quantization or None})
    return out


def main():
    parser = bench_parser(__doc__, seconds=30.0, max_tokens=128, adapters=8, tenants=3)
    parser.add_argument("--streams", default="64,256", help="stream counts, comma-separated")
    parser.add_argument("--deployments", default="llama-3-8b@h100,llama-3-70b:fp8@h200")
    args = parser.parse_args()
    streams = [int(s) for s in args.streams.split(",")]
    deployments = parse_deployments(args.deployments)
    model = model_dir(args.model).resolve()
    var_dir = Path(tempfile.mkdtemp(prefix="loraplex-emulated-"))
    workload, _cold = setup_platform(var_dir, model, args.adapters, args.tenants)
    results = []
    for deployment in deployments:
        env = emulated_env(deployment, max(streams))
        url, proc = start_server(env)
        try:
            asyncio.run(run_streams(url, workload, 4, 3, 8))  # adapters warm, paths compiled
            for n in streams:
                busy0 = metric_total(url, BUSY)
                cpu0 = resource.getrusage(resource.RUSAGE_SELF)
                start = time.perf_counter()
                ttfts, gaps, tokens, errors = asyncio.run(
                    run_streams(url, workload, n, args.seconds, args.max_tokens)
                )
                wall = time.perf_counter() - start
                cpu1 = resource.getrusage(resource.RUSAGE_SELF)
                busy = metric_total(url, BUSY) - busy0
                client_cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
                context = 40 + args.max_tokens // 2  # a chat prompt, half the answer
                ideal = ideal_tokens_per_s(deployment, n, context)
                row = {
                    "deployment": f"{deployment['model']}"
                    + (f":{deployment['quantization']}" if deployment["quantization"] else "")
                    + f"@{deployment['device']}",
                    "streams": n,
                    "requests": len(ttfts),
                    "errors": len(errors),
                    "device_busy": round(busy / wall, 3),
                    "tokens_per_s": round(tokens / wall, 1),
                    "device_alone_tokens_per_s": round(ideal, 1),
                    "share_of_device_alone": round(tokens / wall / ideal, 3),
                    "ttft_p50_s": round(percentile(ttfts, 50), 3),
                    "ttft_p99_s": round(percentile(ttfts, 99), 3),
                    "itl_p50_ms": round(1000 * percentile(gaps, 50), 1),
                    "itl_p99_ms": round(1000 * percentile(gaps, 99), 1),
                    "client_cpu_share": round(client_cpu / wall, 2),  # of one core
                    "error_samples": sorted(set(errors))[:3],
                }
                print(json.dumps(row), flush=True)
                results.append(row)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    print(json.dumps({"runs": results, "seconds": args.seconds, "max_tokens": args.max_tokens}))


if __name__ == "__main__":
    main()
