"""Many adapters, few slots: 100 adapters with Zipf(1.1) popularity served through 8 device
slots and a 32-entry host cache, against the same run with every request on 8 warm adapters.

    .venv/bin/python bench/lora_zipf.py [--model DIR] [--requests 400] [--max-tokens 8]
    .venv/bin/python bench/lora_zipf.py --pool   # also: the memory pool at the same budget

SmolLM2-135M by default, fp32 on CPU, greedy, eos ignored. Every adapter (rank 16, all seven
projections) starts on disk. Requests arrive in a closed loop, --concurrency in flight (a
new one as each finishes), in the same order with the same prompts in both runs; the warm
run maps adapter k to k mod 8, all 8 loaded and in their slots beforehand. Reported: tokens/s
of both and their ratio, hit rate per tier (hits / lookups, a lookup counted at the tier where
it was asked), loads and evictions, and TTFT (arrival to first token, wall clock) p50/p99 by
where the adapter was when the request arrived: device (warm), host, or disk (cold, including
requests that joined a load already running). The 8 slots are a fixed split
(`reserve_lora_slots`: their memory is theirs whether adapters use it or not). With --pool the
Zipf run is repeated with the slot count left to the memory pool (`max_loras` unset) and both
Zipf runs get the same `kv_cache_bytes` (--kv-cache-mib: KV cache, slots, LoRA scratch and
extras together), so the pool's device hit rate and TTFT p99 compare with the fixed 8 slots'
at one budget. The last line is one JSON object.
"""

import json
import random
import time
from collections import deque

from common import bench_parser, chat_prompts, make_adapters, model_dir, percentile

from inference.engine import EngineRequest, LLMEngine, LoRARequest, SamplingParams


def tier_of(engine: LLMEngine, lora: LoRARequest) -> str:
    assert engine.lora_manager is not None, "the engine runs with LoRA on"
    entry = engine.lora_manager.adapters.get(lora.adapter_id)
    if entry is not None and entry.slot is not None:
        return "device"
    return "host" if entry is not None and entry.host is not None else "disk"


def run(engine, plan, prompts, params, concurrency) -> tuple[float, list[dict]]:
    pending, in_flight = deque(range(len(plan))), set[int]()
    records: list[dict] = [{} for _ in plan]
    start = time.perf_counter()
    while pending or in_flight:
        while pending and len(in_flight) < concurrency:
            i = pending.popleft()
            records[i] = {"tier": tier_of(engine, plan[i]), "arrival": time.perf_counter()}
            request = EngineRequest(
                str(i), prompt_token_ids=prompts[i], sampling_params=params, lora_request=plan[i]
            )
            engine.add_request(request)
            in_flight.add(i)
        outputs = engine.step()
        if not outputs:
            engine.wait_for_load(0.01)
        now = time.perf_counter()
        for out in outputs:
            record = records[int(out.request_id)]
            assert out.error is None, out.error
            record.setdefault("first", now)
            record["tokens"] = out.completion_tokens
            if out.finished:
                in_flight.discard(int(out.request_id))
    return time.perf_counter() - start, records


def ttft(records, tier) -> dict:
    values = [r["first"] - r["arrival"] for r in records if r["tier"] == tier]
    if not values:
        return {"n": 0}
    return {"n": len(values), "p50_s": round(percentile(values, 50), 3),
            "p99_s": round(percentile(values, 99), 3)}  # fmt: skip


def hit_rates(lora: dict) -> dict:
    return {
        tier: round(lora["hits"][tier] / lora["lookups"][tier], 3)
        if lora["lookups"][tier]
        else None
        for tier in ("device", "host")
    }


def all_ttft(records) -> dict:
    values = [r["first"] - r["arrival"] for r in records]
    return {"p50_s": round(percentile(values, 50), 3), "p99_s": round(percentile(values, 99), 3)}


def pool_run(config, loras, picks, prompts, params, concurrency) -> dict:
    """The same Zipf run with the slot count left to the memory pool, at the same budget."""
    engine = LLMEngine(**(config | {"max_loras": None, "reserve_lora_slots": False}))
    engine.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=2))
    seconds, records = run(engine, [loras[k] for k in picks], prompts, params, concurrency)
    stats = engine.stats()
    engine.close()
    tokens = sum(r["tokens"] for r in records)
    return {
        "slots_total": stats["lora"]["slots_total"],
        "pool_pages": stats["pool"]["pages"] if stats.get("pool") else None,
        "zipf_tok_s": round(tokens / seconds, 1),
        "hit_rate": hit_rates(stats["lora"]),
        "loads": stats["lora"]["loads"],
        "evictions": stats["lora"]["evictions"],
        "ttft": {tier: ttft(records, tier) for tier in ("device", "host", "disk")},
        "ttft_all": all_ttft(records),
    }


def compare(figures: dict, concurrency: int) -> dict:
    fixed, pool = figures, figures["pool"]
    fixed_p99, pool_p99 = fixed["ttft_all"]["p99_s"], pool["ttft_all"]["p99_s"]
    return {
        "device_hit_rate_fixed": fixed["hit_rate"]["device"],
        "device_hit_rate_pool": pool["hit_rate"]["device"],
        "ttft_p99_ratio": round(pool_p99 / fixed_p99, 3) if fixed_p99 else None,
        "tok_s_ratio": round(pool["zipf_tok_s"] / fixed["zipf_tok_s"], 3),
    }


def main():
    workload = {"adapters": 100, "requests": 400, "max_tokens": 8, "concurrency": 16, "zipf": 1.1}
    args = bench_parser(
        __doc__, **workload, max_loras=8, max_cpu_loras=32, seed=0, pool=False, kv_cache_mib=768
    ).parse_args()
    base = model_dir(args.model)
    folders = make_adapters(base, args.adapters)
    loras = [LoRARequest(f"adapter-{i}", f"bench-{i}", str(f)) for i, f in enumerate(folders)]
    rng = random.Random(args.seed)
    weights = [1 / (k + 1) ** args.zipf for k in range(args.adapters)]
    picks = rng.choices(range(args.adapters), weights=weights, k=args.requests)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    config = {"model": base, "device": "cpu", "dtype": "float32", "enable_lora": True,
              "max_loras": args.max_loras, "reserve_lora_slots": True,
              "max_cpu_loras": args.max_cpu_loras}  # fmt: skip
    if args.pool:
        config["kv_cache_bytes"] = args.kv_cache_mib << 20

    engine = LLMEngine(**config)
    prompts = chat_prompts(engine.tokenizer, args.requests)
    engine.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=2))  # warm the path
    zipf_s, zipf_records = run(engine, [loras[k] for k in picks], prompts, params,
                               args.concurrency)  # fmt: skip
    lora = engine.stats()["lora"]
    engine.close()

    warm = LLMEngine(**config)
    hot = loras[: args.max_loras]
    warm.generate(prompts[: len(hot)], SamplingParams(temperature=0, max_tokens=2),
                  lora_request=hot)  # fmt: skip
    warm_s, warm_records = run(warm, [hot[k % len(hot)] for k in picks], prompts, params,
                               args.concurrency)  # fmt: skip
    warm.close()

    tokens = sum(r["tokens"] for r in zipf_records)
    assert tokens == sum(r["tokens"] for r in warm_records) == args.requests * args.max_tokens
    figures = {
        "model": base.name,
        "adapters": args.adapters,
        "distinct_adapters_requested": len(set(picks)),
        "requests": args.requests,
        "max_tokens": args.max_tokens,
        "concurrency": args.concurrency,
        "max_loras": args.max_loras,
        "max_cpu_loras": args.max_cpu_loras,
        "zipf_tok_s": round(tokens / zipf_s, 1),
        "warm8_tok_s": round(tokens / warm_s, 1),
        "zipf_vs_warm8": round(warm_s / zipf_s, 3),
        "hit_rate": hit_rates(lora),
        "lookups": lora["lookups"],
        "hits": lora["hits"],
        "loads": lora["loads"],
        "evictions": lora["evictions"],
        "ttft": {tier: ttft(zipf_records, tier) for tier in ("device", "host", "disk")},
        "ttft_all": all_ttft(zipf_records),
        "ttft_warm8_run": ttft(warm_records, "device"),
    }
    if args.pool:
        figures["pool"] = pool_run(config, loras, picks, prompts, params, args.concurrency)
        figures["pool_vs_fixed"] = compare(figures, args.concurrency)
    print(f"zipf {figures['zipf_tok_s']} tok/s vs warm-8 {figures['warm8_tok_s']} tok/s "
          f"({figures['zipf_vs_warm8']}); hit rate {figures['hit_rate']}; loads "
          f"{figures['loads']}; TTFT {figures['ttft']}")  # fmt: skip
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
