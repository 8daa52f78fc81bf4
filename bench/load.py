"""HTTP load test: `manage.py serve` with SmolLM2 and 20 adapters over 3 tenants, against the
engine alone on the same workload, plus a thundering herd on one cold adapter.

    .venv/bin/python bench/load.py [--clients 8] [--seconds 60] [--adapters 20] [--max-tokens 32]
        [--system-prompt-tokens 0] [--no-prefix-caching]

Everything runs in a throwaway var dir (SQLite, local object store) so it touches nothing
else. Phase 1: N streaming clients over HTTP for T seconds, each request on a random
adapter of a random tenant. Phase 2: 50 simultaneous first requests for one cold adapter,
then 50 for a warm one; the number of loads comes from /metrics. Phase 3 (server stopped):
the same N-concurrency workload straight into an in-process AsyncLLMEngine for T seconds.
The ratio of phase-1 to phase-3 tokens/s says whether the web layer is the bottleneck.
With --system-prompt-tokens N, each tenant has its own system prompt of about N tokens
(support instructions and examples, bench/prefix_cache.py) sent first in every chat request
of phases 1 and 3 (the herd's requests stay as they are), and the prefix cache's hit rate
over phase 1 comes from /metrics. --no-prefix-caching turns the engine's prefix cache off
(LORAPLEX_ENABLE_PREFIX_CACHING=0 for the server, and in phase 3), for a before/after.
The last line printed is one JSON object of the figures.
"""

import asyncio
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import bench_parser, model_dir

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPTS = [
    "Give me one tip for writing clear emails.",
    "What is a good name for a cat?",
    "Explain recursion in one sentence.",
    "Suggest a weekend hobby.",
    "Why do leaves change colour in autumn?",
    "Describe the sea in a few words.",
]


def percentile(values, q):
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def setup_platform(
    var_dir: Path, model_dir: Path, n_adapters: int, n_tenants: int, system_tokens: int = 0
):
    """Migrate, import the base model, make tenants, keys and ready adapters (+1 kept cold);
    with system_tokens, each tenant's system prompt of about that many tokens."""
    os.environ.update(
        LORAPLEX_VAR_DIR=str(var_dir),
        DJANGO_SETTINGS_MODULE="platform_site.settings",
        LORAPLEX_ENGINE="off",
    )
    os.environ.pop("DATABASE_URL", None)
    import django

    django.setup()
    from django.core.management import call_command

    from registry.services.adapters import adapter_create
    from registry.services.aliases import alias_set
    from registry.services.base_models import base_model_import
    from registry.services.versions import adapter_version_create, adapter_version_validate
    from tenants.services import api_key_create, tenant_create
    from tests.peft_adapters import make_peft_adapter

    call_command("migrate", verbosity=0)
    base, _ = base_model_import(name="smollm2-135m-instruct", path=model_dir, default=True)
    tenants = [tenant_create(slug=f"load-{t}", name=f"Load {t}") for t in range(n_tenants)]
    keys = [api_key_create(tenant=t, name="load", scopes=["inference"])[1] for t in tenants]
    systems = [""] * n_tenants
    if system_tokens:
        from prefix_cache import system_prompt

        from inference.engine.tokenizer import Tokenizer

        tok = Tokenizer.from_folder(model_dir)
        systems = [
            system_prompt(tok, system_tokens, company=f"Load {t} Ltd") for t in range(n_tenants)
        ]
    workload = []  # (key, model name, staged adapter folder, the tenant's system prompt)
    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    for i in range(n_adapters + 1):  # the last one stays cold for the thundering herd
        t = i % n_tenants
        folder = make_peft_adapter(
            model_dir,
            var_dir / "peft" / f"a{i}",
            rank=16,
            alpha=32,
            targets=targets,
            seed=i,
            std=0.02,
            base_model_name=base.name,
        )
        adapter = adapter_create(tenant=tenants[t], name=f"adapter-{i}", actor="bench")
        with (
            open(folder / "adapter_config.json", "rb") as c,
            open(folder / "adapter_model.safetensors", "rb") as w,
        ):
            version, _ = adapter_version_create(adapter=adapter, config=c, weights=w, actor="bench")
        ready = adapter_version_validate(version_id=version.pk)
        assert ready is not None, "the version is gone"
        assert ready.status == "ready", ready.report
        alias_set(adapter=adapter, name="production", version_number=ready.number, actor="bench")
        workload.append((keys[t], f"adapter-{i}", folder, systems[t]))
    return workload[:-1], workload[-1]


def start_server(env: dict) -> tuple[str, subprocess.Popen]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "serve", "--port", str(port), "--log-level", "warning"],
        cwd=ROOT,
        env=env,
    )
    import httpx

    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return url, proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("serve did not become ready")


def chat_messages(system: str, prompt: str) -> list[dict]:
    user = [{"role": "user", "content": prompt}]
    return [{"role": "system", "content": system}] + user if system else user


async def http_request(client, url, key, model, max_tokens, prompt, system=""):
    """One streaming chat request; returns (ttft seconds, completion tokens) or raises."""
    ttft, _gaps, tokens = await timed_stream(client, url, key, model, max_tokens, prompt, system)
    return ttft, tokens


async def timed_stream(client, url, key, model, max_tokens, prompt, system=""):
    """One streaming chat request: (ttft seconds, the gaps between its content chunks,
    completion tokens), or raises."""
    body = {
        "model": model,
        "messages": chat_messages(system, prompt),
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = last = time.perf_counter()
    ttft, gaps, tokens = None, [], 0
    async with client.stream(
        "POST", f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    ) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {await response.aread()}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                now = time.perf_counter()
                if ttft is None:
                    ttft = now - start
                else:
                    gaps.append(now - last)
                last = now
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return ttft if ttft is not None else time.perf_counter() - start, gaps, tokens


async def run_load(send, workload, clients: int, seconds: float, max_tokens: int, seed=0):
    rng = random.Random(seed)
    ttfts, tokens, errors, done = [], 0, [], 0
    deadline = time.perf_counter() + seconds

    async def client_loop():
        nonlocal tokens, done
        while time.perf_counter() < deadline:
            key, model, folder, system = rng.choice(workload)
            try:
                ttft, n = await send(key, model, folder, system, rng.choice(PROMPTS))
            except Exception as exc:  # counted, never fatal: the goal is zero
                errors.append(str(exc)[:200])
                continue
            ttfts.append(ttft)
            tokens += n
            done += 1

    start = time.perf_counter()
    await asyncio.gather(*(client_loop() for _ in range(clients)))
    elapsed = time.perf_counter() - start
    return {
        "completed": done,
        "errors": len(errors),
        "error_samples": errors[:3],
        "tokens": tokens,
        "tokens_per_s": tokens / elapsed,
        "ttft_p50_s": percentile(ttfts, 0.5),
        "ttft_p99_s": percentile(ttfts, 0.99),
        "seconds": elapsed,
    }


def metric_total(url, name) -> float:
    import httpx

    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(
        float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    )


async def herd(url, key, model, n, max_tokens):
    import httpx

    async with httpx.AsyncClient(timeout=600) as client:
        results = await asyncio.gather(
            *(http_request(client, url, key, model, max_tokens, PROMPTS[0]) for _ in range(n)),
            return_exceptions=True,
        )
    ttfts = [r[0] for r in results if not isinstance(r, BaseException)]
    return {
        "ok": len(ttfts),
        "errors": n - len(ttfts),
        "ttft_p50_s": percentile(ttfts, 0.5),
        "ttft_p99_s": percentile(ttfts, 0.99),
    }


async def engine_alone(model_dir, workload, options, clients, seconds, max_tokens):
    from inference.engine import (
        AsyncLLMEngine,
        EngineConfig,
        EngineRequest,
        LLMEngine,
        LoRARequest,
        SamplingParams,
    )

    engine = AsyncLLMEngine(LLMEngine(EngineConfig(model=model_dir, **options)))
    tok = engine.engine.tokenizer
    counter = iter(range(10**9))

    async def send(key, model, folder, system, prompt):
        ids = tok.encode(
            tok.apply_chat_template(chat_messages(system, prompt)), add_special_tokens=False
        )
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        start = time.perf_counter()
        ttft, n = None, 0
        stream = engine.generate(
            EngineRequest(
                f"r{next(counter)}",
                prompt_token_ids=ids,
                sampling_params=params,
                lora_request=LoRARequest(name=model, adapter_id=model, path=str(folder)),
            )
        )
        async for out in stream:
            if ttft is None and out.new_token_ids:
                ttft = time.perf_counter() - start
            n = out.completion_tokens
        return ttft, n

    try:
        return await run_load(send, workload, clients, seconds, max_tokens)
    finally:
        engine.shutdown()


def main():
    args = bench_parser(
        __doc__,
        clients=8,
        seconds=60.0,
        adapters=20,
        tenants=3,
        max_tokens=32,
        herd=50,
        system_prompt_tokens=0,
        no_prefix_caching=False,
    ).parse_args()
    args.model = model_dir(args.model)
    var_dir = Path(tempfile.mkdtemp(prefix="loraplex-load-"))
    workload, cold = setup_platform(
        var_dir, args.model.resolve(), args.adapters, args.tenants, args.system_prompt_tokens
    )
    caching = not args.no_prefix_caching
    options = {
        "max_loras": 8,
        "max_cpu_loras": 32,
        "max_lora_rank": 16,
        "max_num_seqs": 64,
        "enable_lora": True,
        "enable_prefix_caching": caching,
    }
    env = {
        **os.environ,
        "LORAPLEX_ENGINE": "on",
        "LORAPLEX_MAX_LORAS": "8",
        "LORAPLEX_MAX_CPU_LORAS": "32",
        "LORAPLEX_MAX_LORA_RANK": "16",
        "LORAPLEX_RATE_LIMIT_RPM": "0",
        "LORAPLEX_RATE_LIMIT_TPM": "0",
        "LORAPLEX_TENANT_MAX_CONCURRENCY": "0",
        "LORAPLEX_ENABLE_PREFIX_CACHING": "1" if caching else "0",
    }
    url, proc = start_server(env)
    try:
        import httpx

        async def http_phase():
            async with httpx.AsyncClient(
                timeout=600, limits=httpx.Limits(max_connections=args.clients * 2)
            ) as c:

                async def send(key, model, folder, system, prompt):
                    return await http_request(c, url, key, model, args.max_tokens, prompt, system)

                return await run_load(send, workload, args.clients, args.seconds, args.max_tokens)

        http = asyncio.run(http_phase())
        print("http", json.dumps(http), flush=True)
        queries = metric_total(url, "loraplex_prefix_cache_queries_total")
        hits = metric_total(url, "loraplex_prefix_cache_hits_total")
        loads_before = metric_total(url, "loraplex_lora_loads_total")
        cold_herd = asyncio.run(herd(url, cold[0], cold[1], args.herd, 8))
        loads_for_herd = metric_total(url, "loraplex_lora_loads_total") - loads_before
        warm_herd = asyncio.run(herd(url, cold[0], cold[1], args.herd, 8))
        print(
            "herd",
            json.dumps({"cold": cold_herd, "warm": warm_herd, "loads": loads_for_herd}),
            flush=True,
        )
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    alone = asyncio.run(
        engine_alone(args.model, workload, options, args.clients, args.seconds, args.max_tokens)
    )
    print("engine alone", json.dumps(alone), flush=True)
    figures = {
        "clients": args.clients,
        "seconds": args.seconds,
        "adapters": args.adapters,
        "tenants": args.tenants,
        "system_prompt_tokens": args.system_prompt_tokens,
        "prefix_caching": caching,
        "http_completed": http["completed"],
        "http_errors": http["errors"],
        "http_tokens_per_s": round(http["tokens_per_s"], 2),
        "http_ttft_p50_s": http["ttft_p50_s"],
        "http_ttft_p99_s": http["ttft_p99_s"],
        "http_prefix_cache_hit_rate": round(hits / queries, 3) if queries else None,
        "engine_tokens_per_s": round(alone["tokens_per_s"], 2),
        "http_over_engine": round(http["tokens_per_s"] / alone["tokens_per_s"], 3),
        "herd_loads": loads_for_herd,
        "herd_cold_ttft_p99_s": cold_herd["ttft_p99_s"],
        "herd_warm_ttft_p99_s": warm_herd["ttft_p99_s"],
        "herd_errors": cold_herd["errors"] + warm_herd["errors"],
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
