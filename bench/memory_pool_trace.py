"""One memory budget, two kinds of demand: a trace that alternates an adapter-heavy phase (many
distinct adapters, short prompts, Zipf popularity) and a KV-heavy phase (a few adapters, long
prompts, long outputs), served by the unified pool and by fixed splits of the same budget.

    .venv/bin/python bench/memory_pool_trace.py [--kv-cache-mib N] [--splits 4,8,16]
    .venv/bin/python bench/memory_pool_trace.py --load 0.9   # Poisson arrivals instead
    .venv/bin/python bench/memory_pool_trace.py --emulate-device h200 \
        --emulate-model llama-3-70b --emulate-quantization fp8   # a GPU's pool, emulated

SmolLM2-135M by default, fp32 on CPU, greedy, eos ignored. Every engine gets the same
`kv_cache_bytes` (KV pages, adapter slots, the LoRA scratch and extras arena together) and
the same host cache. The pool (`max_loras` unset) sizes its slots from demand; a fixed split
reserves `max_loras` slots whose pages never serve as KV blocks (`reserve_lora_slots`), as
engines before the pool did. By default the budget is the one the trace is about: the
KV-heavy phase's sequences fit beside its own adapters' slots and no more, so every slot a
fixed split holds beyond those is KV the long requests lack (--kv-cache-mib sets another).

Each engine serves the same trace: --cycles of (adapter-heavy, KV-heavy). Closed loop (the
default): each phase keeps its own concurrency in flight (a new request as each finishes),
and a phase starts when the last ended. Open loop (--load L): requests arrive as a Poisson
process, each phase at L times the request rate the pool sustained in that phase of a
closed-loop run of the first cycle (the calibration, reported), phases back to back in
time whatever the backlog, as traffic shifts; TTFT then includes the queue. Long prompts are
distinct random token ids, so no prefix is shared. Reported per engine, for the whole trace
and per phase (a phase's figures from its first arrival to its last completion, over every
cycle): tokens/s and TTFT (arrival to first token) p50/p99. Then the pool against every
fixed split, against the better one (the higher throughput over the whole trace) and the
default (4 slots), as ratios measured in the same run; `goal_met` holds when the pool makes
at least 1.3x the better split's tokens/s or at most half its TTFT p99. Beside them, the
best of each phase: the whole trace's tokens/s had each phase run as fast as its fastest
fixed split, the most any split of the memory could give this trace. The last line is one
JSON object.

On an emulated GPU (--emulate-device, --emulate-model, --emulate-quantization; README "An
emulated GPU"), every engine's pool is that deployment's (the whole device's, unless
--kv-cache-mib), SmolLM2's tokenizer and adapters stand in, and the clock is virtual: a
step's device time is counted, not waited for, the host's work takes its real time. The
adapter-heavy phase then spreads over 100 adapters, the host tier holds them all, and the
KV-heavy phase keeps in flight as many long requests as the pool holds beside its own
adapters (--kv-concurrency 0, the default there), twice that many in all.
"""

import json
import random
import sys
import time
from collections import deque

from common import bench_parser, chat_prompts, make_adapters, model_dir, percentile

from inference.engine import EngineRequest, LLMEngine, LoRARequest, SamplingParams
from inference.engine.config import EngineConfig
from inference.engine.emulation import EmulatedModelRunner
from inference.engine.emulation.target import EmulationTarget
from inference.engine.errors import ConfigError
from inference.engine.lora.slots import reserved_nbytes, slot_layout
from inference.engine.memory_pool import pages_per_slot
from inference.engine.planning.memory import meta_model
from inference.engine.simulation import VirtualClock
from inference.engine.tokenizer import Tokenizer

POOL = "pool"
DEFAULT_SPLIT = "fixed-4"  # the slot count engines reserved by default before the pool
PHASES = ("adapters", "kv")
GOAL_THROUGHPUT, GOAL_TTFT_P99 = 1.3, 0.5
# An emulated GPU's trace: the workload the defaults give a CPU's budget, at a GPU's scale.
EMULATED_DEFAULTS = {"adapters": 100, "adapter_requests": 384, "adapter_concurrency": 64,
                     "max_cpu_loras": 100, "splits": "4,8,16,32,64"}  # fmt: skip


class WallClock:
    """The engine's own time: a step takes what it takes here."""

    def now(self) -> float:
        return time.perf_counter()

    def wait(self, seconds: float) -> None:
        time.sleep(seconds)


class DeviceClock:
    """An emulated device's virtual time: the host's real time plus the device's counted
    time; waiting for an arrival skips to it."""

    def __init__(self, engine: LLMEngine):
        runner = engine.model_runner
        assert isinstance(runner, EmulatedModelRunner)
        runner.device.sleeps = False
        self.clock: VirtualClock = VirtualClock(runner)

    def now(self) -> float:
        return self.clock.now()

    def wait(self, seconds: float) -> None:
        self.clock.skip_to(self.clock.now() + seconds)


def clock_for(engine: LLMEngine) -> WallClock | DeviceClock:
    return DeviceClock(engine) if engine.config.emulate_device is not None else WallClock()


def make_trace(args, loras, short: list[list[int]], vocab_size: int) -> list[dict]:
    """The requests of every phase, in order: the adapter, the prompt, the output length.
    The adapter-heavy phase cycles through the `short` prompts; long prompts are random."""
    rng = random.Random(args.seed)
    weights = [1 / (k + 1) ** args.zipf for k in range(len(loras))]
    trace: list[dict] = []
    for cycle in range(args.cycles):
        picks = rng.choices(range(len(loras)), weights=weights, k=args.adapter_requests)
        for i, k in enumerate(picks):
            prompt = short[i % len(short)]
            trace.append({"phase": "adapters", "cycle": cycle, "lora": loras[k],
                          "prompt": prompt, "max_tokens": args.short_output})  # fmt: skip
        for i in range(args.kv_requests):
            prompt = [rng.randrange(16, vocab_size) for _ in range(args.long_prompt)]
            trace.append({"phase": "kv", "cycle": cycle, "lora": loras[i % args.kv_adapters],
                          "prompt": prompt, "max_tokens": args.long_output})  # fmt: skip
    return trace


def submit(engine: LLMEngine, trace: list[dict], i: int) -> None:
    item = trace[i]
    params = SamplingParams(temperature=0, max_tokens=item["max_tokens"], ignore_eos=True)
    request = EngineRequest(
        str(i), prompt_token_ids=item["prompt"], sampling_params=params, lora_request=item["lora"]
    )
    engine.add_request(request)


def step(engine: LLMEngine, clock, records: list[dict], in_flight: set[int]) -> None:
    """One engine step (or a short wait for an adapter load); outputs into `records`."""
    outputs = engine.step()
    if not outputs:
        engine.wait_for_load(0.01)
    now = clock.now()
    for out in outputs:
        assert out.error is None, out.error
        record = records[int(out.request_id)]
        record.setdefault("first", now)
        record["tokens"], record["done"] = out.completion_tokens, now
        if out.finished:
            in_flight.discard(int(out.request_id))


def phase_bounds(trace: list[dict]) -> list[tuple[int, int]]:
    starts = [0] + [i for i in range(1, len(trace)) if trace[i]["phase"] != trace[i - 1]["phase"]]
    return list(zip(starts, [*starts[1:], len(trace)], strict=True))


def serve_closed(
    engine: LLMEngine, clock, trace: list[dict], concurrency: dict[str, int]
) -> list[dict]:
    """The trace in closed loops, phase after phase (a phase starts when the last ended)."""
    records: list[dict] = [{} for _ in trace]
    for start, end in phase_bounds(trace):
        limit = concurrency[trace[start]["phase"]]
        pending, in_flight = deque(range(start, end)), set[int]()
        while pending or in_flight:
            while pending and len(in_flight) < limit:
                i = pending.popleft()
                records[i] = {"arrival": clock.now()}
                submit(engine, trace, i)
                in_flight.add(i)
            step(engine, clock, records, in_flight)
        print(f"  {trace[start]['phase']} phase done", file=sys.stderr, flush=True)
    return records


def serve_open(engine: LLMEngine, clock, trace: list[dict], arrivals: list[float]) -> list[dict]:
    """Each request submitted at its arrival (seconds from the start), whatever the engine
    is doing; its TTFT counts from that arrival, also when a step under way delays it."""
    records: list[dict] = [{"arrival": 0.0} for _ in trace]
    start = clock.now()
    due, in_flight = deque(range(len(trace))), set[int]()
    while due or in_flight:
        now = clock.now() - start
        while due and arrivals[due[0]] <= now:
            i = due.popleft()
            records[i]["arrival"] = start + arrivals[i]
            submit(engine, trace, i)
            in_flight.add(i)
        if in_flight:
            step(engine, clock, records, in_flight)
        else:
            clock.wait(min(arrivals[due[0]] - now, 0.05))
    return records


def poisson_arrivals(trace: list[dict], rates: dict[str, float], seed: int) -> list[float]:
    """Arrival times: each phase's requests at its rate (exponential gaps), phases back to back."""
    rng = random.Random(seed)
    arrivals, t = [], 0.0
    for item in trace:
        t += rng.expovariate(rates[item["phase"]])
        arrivals.append(t)
    return arrivals


def calibrate(trace: list[dict], records: list[dict]) -> dict[str, float]:
    """Requests per second each phase sustained in a closed-loop run (its first cycle)."""
    rates = {}
    for name in PHASES:
        part = [r for t, r in zip(trace, records, strict=True)
                if t["cycle"] == 0 and t["phase"] == name]  # fmt: skip
        rates[name] = len(part) / (max(r["done"] for r in part) - min(r["arrival"] for r in part))
    return rates


def figures(trace, records, phase: str | None) -> dict:
    """Tokens/s from first arrival to last completion (per phase: summed over its cycles,
    not the time between them) and TTFT percentiles; phase None: the whole trace."""
    rows = [(t, r) for t, r in zip(trace, records, strict=True) if phase in (None, t["phase"])]
    ttft = [r["first"] - r["arrival"] for _, r in rows]
    tokens = sum(r["tokens"] for _, r in rows)
    if phase is None:
        seconds = max(r["done"] for _, r in rows) - min(r["arrival"] for _, r in rows)
    else:
        seconds = 0.0
        for cycle in sorted({t["cycle"] for t, _ in rows}):
            part = [r for t, r in rows if t["cycle"] == cycle]
            seconds += max(r["done"] for r in part) - min(r["arrival"] for r in part)
    return {
        "tokens": tokens,
        "tok_s": round(tokens / seconds, 2),
        "ttft_p50_s": round(percentile(ttft, 50), 3),
        "ttft_p99_s": round(percentile(ttft, 99), 3),
    }


def engine_config(args, base, split: str, budget: int | None) -> dict:
    config = {"model": base, "enable_lora": True,
              "kv_cache_bytes": budget, "max_cpu_loras": args.max_cpu_loras,
              "max_loras": None if split == POOL else int(split),
              "reserve_lora_slots": split != POOL,
              "max_num_seqs": max(args.adapter_concurrency, args.kv_concurrency)}  # fmt: skip
    if args.emulate_device is None:
        return config | {"device": "cpu", "dtype": "float32"}
    return config | {
        "emulate_device": args.emulate_device,
        "emulate_model": args.emulate_model,
        "emulate_quantization": args.emulate_quantization,
    }


def emulated_kv_concurrency(args, base) -> int:
    """As many long requests as the emulated device's pool holds, whole, beside the slots of
    the KV-heavy phase's adapters and one spare page: the planner's pages for that GPU."""
    config = EngineConfig(**engine_config(args, base, POOL, args.kv_cache_mib << 20 or None))
    plan = EmulationTarget.resolve(config).plan
    per_sequence = -(-(args.long_prompt + args.long_output) // config.block_size)
    free = plan.kv_blocks - args.kv_adapters * plan.pages_per_slot - 1
    if free < per_sequence:
        raise SystemExit(f"the emulated pool ({plan.kv_blocks} pages) holds no long request")
    return free // per_sequence


def kv_phase_budget(config: EngineConfig, kv_adapters: int, sequences: int, tokens: int) -> int:
    """The budget whose pool holds `sequences` of `tokens` tokens, whole, beside the slots
    of `kv_adapters` adapters and one spare page (and the decode graphs' padding page), plus
    what the LoRA slots keep outside the pool (scratch, extras arena): the engine's own
    arithmetic on the model's shapes, no weights loaded."""
    assert config.max_model_len is not None  # resolved by EngineConfig
    model = meta_model(config.model_config, config.torch_dtype, 1, config.max_model_len)
    page = config.kv_block_bytes
    row = slot_layout(model, config.max_lora_rank).numel * config.torch_dtype.itemsize
    assert config.max_num_batched_tokens is not None  # resolved by EngineConfig
    outside = reserved_nbytes(
        model, config.max_loras, config.max_lora_rank,
        max(config.max_num_batched_tokens, config.max_num_seqs),
        extra_bytes=config.lora_extra_bytes, max_saved_params=config.max_saved_module_params,
    )  # fmt: skip
    graphs = str(config.device).startswith("cuda") and not config.enforce_eager
    per_sequence = -(-tokens // config.block_size)
    pages = sequences * per_sequence + kv_adapters * pages_per_slot(row, page) + 1 + graphs
    return outside + pages * page


def ratios(pool: dict, fixed: dict) -> dict:
    return {
        "throughput": round(pool["whole"]["tok_s"] / fixed["whole"]["tok_s"], 3),
        "ttft_p99": round(pool["whole"]["ttft_p99_s"] / fixed["whole"]["ttft_p99_s"], 3),
        **{
            f"{phase}_{what}": round(pool[phase][key] / fixed[phase][key], 3)
            for phase in PHASES
            for what, key in (("throughput", "tok_s"), ("ttft_p99", "ttft_p99_s"))
        },
    }


def fastest(fixed: dict, phase: str) -> str:
    return max(fixed, key=lambda name: fixed[name][phase]["tok_s"])


def best_of_each_phase(fixed: dict) -> float:
    """Tokens/s over the whole trace of an engine that served each phase as the fixed split
    fastest in that phase did: what no policy that only splits the memory can beat."""
    any_engine = next(iter(fixed.values()))
    seconds = sum(any_engine[phase]["tokens"] / fixed[fastest(fixed, phase)][phase]["tok_s"]
                  for phase in PHASES)  # fmt: skip
    return any_engine["whole"]["tokens"] / seconds


def compare(results: dict) -> dict:
    pool = results[POOL]
    fixed = {name: r for name, r in results.items() if name != POOL}
    vs = {name: ratios(pool, r) for name, r in fixed.items()}
    better = fastest(fixed, "whole")
    bound = best_of_each_phase(fixed)
    met = vs[better]["throughput"] >= GOAL_THROUGHPUT or vs[better]["ttft_p99"] <= GOAL_TTFT_P99
    return {
        "vs": vs,
        "better_fixed_split": better,
        "throughput_vs_better_fixed": vs[better]["throughput"],
        "ttft_p99_vs_better_fixed": vs[better]["ttft_p99"],
        "throughput_vs_default": vs[DEFAULT_SPLIT]["throughput"] if DEFAULT_SPLIT in vs else None,
        "ttft_p99_vs_default": vs[DEFAULT_SPLIT]["ttft_p99"] if DEFAULT_SPLIT in vs else None,
        **{f"{phase}_phase_best_fixed": fastest(fixed, phase) for phase in PHASES},
        "best_of_each_phase_tok_s": round(bound, 2),
        "best_of_each_phase_vs_better_fixed": round(bound / fixed[better]["whole"]["tok_s"], 3),
        "goal_met": met,
        "goal_met_vs_every_split": all(
            r["throughput"] >= GOAL_THROUGHPUT or r["ttft_p99"] <= GOAL_TTFT_P99
            for r in vs.values()
        ),
    }


def run_engine(engine: LLMEngine, args, trace: list[dict], arrivals=None) -> dict:
    """The engine through the trace (closed loop, or open at `arrivals` when given), then
    closed; its figures, and the records they came from."""
    try:
        engine.generate([trace[0]["prompt"]], SamplingParams(temperature=0, max_tokens=2))
        clock = clock_for(engine)
        if arrivals is None:
            concurrency = {"adapters": args.adapter_concurrency, "kv": args.kv_concurrency}
            records = serve_closed(engine, clock, trace, concurrency)
        else:
            records = serve_open(engine, clock, trace, arrivals)
        stats = engine.stats()
    finally:
        engine.close()
    lora = stats["lora"]
    return {
        "whole": figures(trace, records, None),
        **{phase: figures(trace, records, phase) for phase in PHASES},
        "slots": lora["slots_total"],
        "pages": stats["pool"]["pages"],
        "lora": {key: lora.get(key) for key in ("loads", "evictions", "hits", "lookups")},
        "pool": {key: stats["pool"][key] for key in ("resizes", "evictions", "blocks_moved")},
        "preemptions": stats["preemptions"],
        "records": records,
    }


def main():
    parser = bench_parser(
        __doc__, kv_cache_mib=0, adapters=64, kv_adapters=4, zipf=1.1, cycles=2,
        adapter_requests=96, adapter_concurrency=32, short_output=32,
        kv_requests=8, kv_concurrency=4, long_prompt=4096, long_output=256,
        max_cpu_loras=64, seed=0,
    )  # fmt: skip
    parser.add_argument("--splits", default=None, help="fixed max_loras values to compare")
    parser.add_argument(
        "--load", type=float, default=0.0, help="Poisson arrivals at this share of the pool's rates"
    )
    parser.add_argument("--emulate-device", help="a GPU the planner knows (h200, h100, ...)")
    parser.add_argument("--emulate-model", help="a planner preset or a config.json")
    parser.add_argument("--emulate-quantization", help="the emulated model's (fp8, ...)")
    emulated_defaults = EMULATED_DEFAULTS | {"kv_concurrency": 0, "kv_requests": 0}
    args = parser.parse_args()
    base = model_dir(args.model)
    if args.emulate_device is not None:
        for name, value in emulated_defaults.items():  # the GPU's scale, unless given
            if getattr(args, name) == parser.get_default(name):
                setattr(args, name, value)
        args.kv_concurrency = args.kv_concurrency or emulated_kv_concurrency(args, base)
        args.kv_requests = args.kv_requests or 2 * args.kv_concurrency
    args.splits = args.splits or "4,8,16"
    loras = [LoRARequest(f"adapter-{i}", f"bench-{i}", str(f))
             for i, f in enumerate(make_adapters(base, args.adapters))]  # fmt: skip
    config = EngineConfig(**engine_config(args, base, POOL, None))
    budget = args.kv_cache_mib << 20 or (
        None  # an emulated device's own pool
        if args.emulate_device is not None
        else kv_phase_budget(
            config, args.kv_adapters, args.kv_concurrency, args.long_prompt + args.long_output
        )
    )
    short = chat_prompts(Tokenizer.from_folder(base), 16)
    trace = make_trace(args, loras, short, config.model_config.vocab_size)
    arrivals, calibration = None, None
    if args.load:
        first = [t for t in trace if t["cycle"] == 0]
        engine = LLMEngine(**engine_config(args, base, POOL, budget))
        records = run_engine(engine, args, first)["records"]
        calibration = {name: rate * args.load for name, rate in calibrate(first, records).items()}
        arrivals = poisson_arrivals(trace, calibration, args.seed)
        print("arrival rates (requests/s):", calibration, flush=True)

    results, skipped = {}, {}
    for split in [POOL, *args.splits.split(",")]:
        name = split if split == POOL else f"fixed-{split}"
        try:
            engine = LLMEngine(**engine_config(args, base, split, budget))
        except ConfigError as error:  # a split the budget cannot hold: reported, not fatal
            print(name, "does not fit:", error, file=sys.stderr, flush=True)
            skipped[name] = str(error)
            continue
        results[name] = run_engine(engine, args, trace, arrivals)
        del results[name]["records"]
        print(name, results[name]["whole"], flush=True)
    out = {
        "model": base.name,
        "emulated": None if args.emulate_device is None else {
            "device": args.emulate_device, "model": args.emulate_model,
            "quantization": args.emulate_quantization},
        "budget_bytes": budget,
        "arrivals": "closed loop" if arrivals is None else "poisson",
        "load": args.load or None,
        "arrival_rates": calibration,
        "workload": {key: getattr(args, key) for key in (
            "adapters", "kv_adapters", "zipf", "cycles", "adapter_requests",
            "adapter_concurrency", "short_output", "kv_requests", "kv_concurrency",
            "long_prompt", "long_output", "max_cpu_loras")},
        "engines": results,
        "splits_that_do_not_fit": skipped,
        "comparison": compare(results),
    }  # fmt: skip
    print(json.dumps(out))


if __name__ == "__main__":
    main()
