"""The memory pool against fixed splits of one budget, on the device: the trace of
bench/memory_pool_trace.py (an adapter-heavy phase over every served adapter, Zipf 1.1,
short prompts; then a KV-heavy phase on 4 adapters, long prompts and outputs) in closed
loops, at the served model's shapes, on the pool and on fixed splits (4 and 16 slots on the
GPU).

The budget holds the KV-heavy phase's sequences beside its own adapters' slots and no more,
as in the CPU benchmark. A decode step on a GPU costs about as much at any batch size, so
the adapters a fixed split cannot hold at once (adapter-heavy) and the KV it lacks
(KV-heavy) cost throughput there; on a CPU, where a step's cost grows with the batch and a
long prefill takes seconds, they cost mostly latency. Run on request only:

    python bench/gpu_suite.py --sections pool_trace
"""

from types import SimpleNamespace
from typing import Any

from gpu_suite_context import Context
from gpu_suite_decode import random_prompts
from memory_pool_trace import POOL, compare, kv_phase_budget, make_trace, run_engine

SHORT_PROMPT = 48  # tokens of each adapter-heavy request's prompt
KV_ADAPTERS = 4


def trace_args(ctx: Context, adapters: int) -> SimpleNamespace:
    """The trace's sizes: the profile's, the KV-heavy phase within its max_model_len."""
    t = ctx.profile.trace
    return SimpleNamespace(
        adapters=adapters, kv_adapters=KV_ADAPTERS, zipf=1.1, cycles=1, seed=0,
        adapter_requests=t.adapter_requests, adapter_concurrency=t.adapter_concurrency,
        short_output=t.short_output, kv_requests=t.kv_requests, kv_concurrency=t.kv_concurrency,
        long_prompt=t.long_prompt, long_output=t.long_output,
    )  # fmt: skip


def pool_trace(ctx: Context) -> dict[str, Any]:
    from inference.engine import LoRARequest
    from inference.engine.config import EngineConfig

    folders = ctx.adapters()
    loras = [LoRARequest(f"bench-{i}", f"bench-{i}", str(f)) for i, f in enumerate(folders)]
    args = trace_args(ctx, len(loras))
    settings = {
        "enable_lora": True, "max_lora_rank": 16, "max_cpu_loras": len(loras),
        "max_num_seqs": max(args.adapter_concurrency, args.kv_concurrency),
    }  # fmt: skip
    p = ctx.profile
    config = EngineConfig(
        model=ctx.served, device=p.device, dtype=p.dtype, max_model_len=p.max_model_len,
        block_size=p.block_size, **settings,
    )  # fmt: skip
    budget = kv_phase_budget(
        config, KV_ADAPTERS, args.kv_concurrency, args.long_prompt + args.long_output
    )
    vocab = config.model_config.vocab_size
    short = random_prompts(16, SHORT_PROMPT, vocab, seed=3)
    trace = make_trace(args, loras, short, vocab)
    results: dict[str, Any] = {}
    for split in (POOL, *map(str, ctx.profile.trace.splits)):
        name = split if split == POOL else f"fixed-{split}"
        slots = {} if split == POOL else {"max_loras": int(split), "reserve_lora_slots": True}
        try:
            engine = ctx.engine(ctx.served, kv_cache_bytes=budget, **settings, **slots)
            results[name] = run_engine(engine, args, trace)
            del results[name]["records"]
        except Exception as error:  # one engine failing leaves the others' figures
            results[name] = {"error": f"{type(error).__name__}: {error}"}
    ran = {name: r for name, r in results.items() if "error" not in r}
    return {
        "budget_bytes": budget,
        "workload": vars(args),
        "engines": results,
        "comparison": compare(ran) if POOL in ran and len(ran) > 1 else None,
    }
