"""One memory budget, two kinds of demand: a trace that alternates an adapter-heavy phase (many
distinct adapters, short prompts, Zipf popularity) and a KV-heavy phase (a few adapters, long
prompts, long outputs), served by the unified pool and by fixed splits of the same budget.

    .venv/bin/python bench/memory_pool_trace.py [--kv-cache-mib 768] [--splits 4,1,32]

SmolLM2-135M by default, fp32 on CPU, greedy, eos ignored. Every engine gets the same
`kv_cache_bytes` (KV blocks and adapter slots together) and the same host cache; the pool
(`max_loras` unset) sizes its slots from demand, a fixed split keeps `max_loras` slots. Each
engine serves the same trace in the same order: --cycles of (adapter-heavy, KV-heavy), each
phase --phase-requests requests in a closed loop of --concurrency in flight (a new one as each
finishes). Long prompts are distinct random token ids, so no prefix is shared. Reported per
engine and per phase: tokens/s and TTFT (arrival to first token) p50/p99; then the pool
against the best fixed split of each phase and against the fixed split that is best over the
whole trace, as ratios measured in the same run. The last line is one JSON object.
"""

import json
import random
import sys
import time
from collections import deque

from common import bench_parser, chat_prompts, make_adapters, model_dir, percentile

from inference.engine import EngineRequest, LLMEngine, LoRARequest, SamplingParams
from inference.engine.errors import ConfigError

POOL = "pool"


def make_trace(args, loras, tokenizer, vocab_size) -> list[dict]:
    """The requests of every phase, in order: the adapter, the prompt, the output length."""
    rng = random.Random(args.seed)
    short = chat_prompts(tokenizer, args.phase_requests)
    weights = [1 / (k + 1) ** args.zipf for k in range(args.adapters)]
    trace: list[dict] = []
    for cycle in range(args.cycles):
        for k in rng.choices(range(args.adapters), weights=weights, k=args.phase_requests):
            prompt = short[len(trace) % len(short)]
            trace.append({"phase": "adapters", "cycle": cycle, "lora": loras[k],
                          "prompt": prompt, "max_tokens": args.short_output})  # fmt: skip
        for i in range(args.phase_requests):
            prompt = [rng.randrange(16, vocab_size) for _ in range(args.long_prompt)]
            trace.append({"phase": "kv", "cycle": cycle, "lora": loras[i % args.kv_adapters],
                          "prompt": prompt, "max_tokens": args.long_output})  # fmt: skip
    return trace


def serve(engine: LLMEngine, trace: list[dict], concurrency: int) -> list[dict]:
    """The trace in a closed loop, phase after phase (a phase starts when the last ended)."""
    records: list[dict] = [{} for _ in trace]
    phases = [i for i in range(1, len(trace)) if trace[i]["phase"] != trace[i - 1]["phase"]]
    for start, end in zip([0, *phases], [*phases, len(trace)], strict=True):
        pending, in_flight = deque(range(start, end)), set[int]()
        while pending or in_flight:
            while pending and len(in_flight) < concurrency:
                i = pending.popleft()
                item = trace[i]
                params = SamplingParams(temperature=0, max_tokens=item["max_tokens"],
                                        ignore_eos=True)  # fmt: skip
                records[i] = {"arrival": time.perf_counter()}
                engine.add_request(EngineRequest(str(i), prompt_token_ids=item["prompt"],
                                                 sampling_params=params,
                                                 lora_request=item["lora"]))  # fmt: skip
                in_flight.add(i)
            outputs = engine.step()
            if not outputs:
                engine.wait_for_load(0.01)
            now = time.perf_counter()
            for out in outputs:
                assert out.error is None, out.error
                record = records[int(out.request_id)]
                record.setdefault("first", now)
                record["tokens"], record["done"] = out.completion_tokens, now
                if out.finished:
                    in_flight.discard(int(out.request_id))
        print(f"  {trace[start]['phase']} phase done", file=sys.stderr, flush=True)
    return records


def figures(trace, records, phase: str | None) -> dict:
    rows = [r for t, r in zip(trace, records, strict=True) if phase in (None, t["phase"])]
    seconds = max(r["done"] for r in rows) - min(r["arrival"] for r in rows)
    ttft = [r["first"] - r["arrival"] for r in rows]
    if phase is None:  # the whole trace: the phases' own spans, not the gaps between runs
        seconds = 0.0
        for cycle in sorted({t["cycle"] for t in trace}):
            for name in ("adapters", "kv"):
                part = [r for t, r in zip(trace, records, strict=True)
                        if t["cycle"] == cycle and t["phase"] == name]  # fmt: skip
                seconds += max(r["done"] for r in part) - min(r["arrival"] for r in part)
    return {
        "tok_s": round(sum(r["tokens"] for r in rows) / seconds, 1),
        "ttft_p50_s": round(percentile(ttft, 50), 3),
        "ttft_p99_s": round(percentile(ttft, 99), 3),
    }


def engine_config(args, base, split: str) -> dict:
    return {"model": base, "device": "cpu", "dtype": "float32", "enable_lora": True,
            "kv_cache_bytes": args.kv_cache_mib << 20, "max_cpu_loras": args.max_cpu_loras,
            "max_loras": None if split == POOL else int(split),
            "max_num_seqs": args.concurrency}  # fmt: skip


def main():
    parser = bench_parser(
        __doc__, kv_cache_mib=768, adapters=64, kv_adapters=4, zipf=1.1, cycles=2,
        phase_requests=32, concurrency=16, short_output=16, long_prompt=1024, long_output=128,
        max_cpu_loras=16, seed=0,
    )  # fmt: skip
    parser.add_argument("--splits", default="4,1,32", help="fixed max_loras values to compare")
    args = parser.parse_args()
    base = model_dir(args.model)
    loras = [LoRARequest(f"adapter-{i}", f"bench-{i}", str(f))
             for i, f in enumerate(make_adapters(base, args.adapters))]  # fmt: skip
    splits = [POOL, *args.splits.split(",")]
    results, trace, skipped = {}, None, {}
    for split in splits:
        name = split if split == POOL else f"fixed-{split}"
        try:
            engine = LLMEngine(**engine_config(args, base, split))
        except ConfigError as error:  # a split the budget cannot hold: reported, not fatal
            print(name, "does not fit:", error, file=sys.stderr, flush=True)
            skipped[name] = str(error)
            continue
        if trace is None:
            trace = make_trace(args, loras, engine.tokenizer, engine.config.model_config.vocab_size)
        engine.generate([trace[0]["prompt"]], SamplingParams(temperature=0, max_tokens=2))
        records = serve(engine, trace, args.concurrency)
        stats = engine.stats()
        engine.close()
        results[name] = {
            "whole": figures(trace, records, None),
            "adapters": figures(trace, records, "adapters"),
            "kv": figures(trace, records, "kv"),
            "lora": {
                key: stats["lora"].get(key) for key in ("loads", "evictions", "hits", "lookups")
            },  # fmt: skip
            "pool": stats.get("pool"),
        }
        print(name, results[name]["whole"], flush=True)
    fixed = {name: r for name, r in results.items() if name != POOL}
    pool = results[POOL]
    best_whole = max(fixed, key=lambda name: fixed[name]["whole"]["tok_s"])
    comparison = {
        "better_fixed_split": best_whole,
        "throughput_vs_better_fixed": round(
            pool["whole"]["tok_s"] / fixed[best_whole]["whole"]["tok_s"], 3
        ),
        "ttft_p99_vs_better_fixed": round(
            pool["whole"]["ttft_p99_s"] / fixed[best_whole]["whole"]["ttft_p99_s"], 3
        ),
        "throughput_vs_default_4": round(
            pool["whole"]["tok_s"] / fixed["fixed-4"]["whole"]["tok_s"], 3
        )
        if "fixed-4" in fixed
        else None,
    }
    for phase in ("adapters", "kv"):
        best = max(fixed, key=lambda name, p=phase: fixed[name][p]["tok_s"])
        comparison[f"{phase}_phase_best_fixed"] = best
        comparison[f"{phase}_phase_throughput_vs_best_fixed"] = round(
            pool[phase]["tok_s"] / fixed[best][phase]["tok_s"], 3
        )
        comparison[f"{phase}_phase_ttft_p99_vs_best_fixed"] = round(
            pool[phase]["ttft_p99_s"] / fixed[best][phase]["ttft_p99_s"], 3
        )
    out = {
        "model": base.name,
        "workload": {key: getattr(args, key) for key in (
            "kv_cache_mib", "adapters", "kv_adapters", "zipf", "cycles", "phase_requests",
            "concurrency", "short_output", "long_prompt", "long_output", "max_cpu_loras")},
        "engines": results,
        "splits_that_do_not_fit": skipped,
        "comparison": comparison,
    }  # fmt: skip
    print(json.dumps(out))


if __name__ == "__main__":
    main()
