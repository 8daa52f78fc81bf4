"""Prefill fairness: one tenant's short chats while another tenant's 8,000-token prompt is
prefilled, against the same chats on an idle engine, with the tenants' shares of a step's
prefill tokens and without them (the scheduler before), side by side in one process.

    .venv/bin/python bench/prefill_fairness.py [--model DIR] [--long-tokens 8000]
        [--shorts 6] [--short-max-tokens 8] [--prompt-logprobs 0] [--before REV] [--wall]
        [--budget N] [--threshold N] [--before-budget 512]

Two engines on SmolLM2 (or --model), fp32 on cpu: "fair" runs this checkout's scheduler
with the defaults (or --budget and --threshold), "before" the scheduler of git revision
--before (default: the one before the shares; `--before ""` leaves that engine out) with
the defaults it had: a budget of --before-budget tokens, each token counted 1. Every
request carries a tenant (fairness key): tenant A sends the long prompt (a support
handbook to summarise, its own text each time so the prefix cache never helps;
--prompt-logprobs N asks for its prompt logprobs, as the attack did), tenant B the short
chats (a four-word question in SmolLM2's chat template, --short-max-tokens tokens each).
Phases, each run on both engines in turn, one step each:

  1. idle: --shorts short chats one at a time on the idle engine (and as many again after
     phase 3, so a burst of load elsewhere moves the idle median less): their TTFT;
  2. alone: the long prompt alone (max_tokens 1): its TTFT;
  3. beside: a new long prompt and a short chat arrive at the same moment (the attack),
     then --shorts - 1 more short chats arrive at even intervals over the long prompt's
     TTFT alone (phase 2, on that engine's clock). A chat that arrives in the middle of a
     step waits for it: its TTFT runs from the moment it arrived, not from the step after.

Each engine keeps its own clock, advanced by its steps only: by default the CPU time the
process spends in them (time.process_time, both torch threads), which load from other
processes moves less than wall time (not nothing: a torch thread waiting for one that was
descheduled spins); `--wall` measures wall time instead (the
other clock's figures are reported too, arrivals on it placed at the same offset).
Phase 3's short chats also go, each as the fair engine takes it in, to a third engine that
is otherwise idle and steps in turn with the two: their TTFT there (median) is the idle
TTFT the ratios use, measured under the same load from elsewhere as the chats beside the
long prompt (phase 1's figure is reported too). Figures per engine: the short chats' TTFT
arriving with the long prompt, and arriving while it prefills (median and max over those
that arrived before its first token), each as a ratio to idle; the long prompt's TTFT
beside the chats and alone, and their ratio. Goals (fair): a short chat's TTFT while the
long prompt prefills <= 3x idle; the long prompt's TTFT beside <= 1.3x alone. The last line
is one JSON object of the figures.
"""

import importlib.util
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from chunked_prefill import long_prompt
from common import bench_parser, model_dir

from inference.engine import EngineRequest, LLMEngine, SamplingParams

ROOT = Path(__file__).resolve().parents[1]
SHARE_MODULE = "inference/engine/prefill_share.py"
WORDS = ["hello", "thanks", "goodbye", "morning", "weather", "coffee", "music", "books",
         "trains", "rivers", "stars", "gardens"]  # fmt: skip


def short_prompt(tokenizer, phase: str, i: int) -> list[int]:
    """A four-word chat question, different in every phase and request."""
    words = f"{phase} {i}: {WORDS[i % len(WORDS)]}?"
    text = tokenizer.apply_chat_template([{"role": "user", "content": words}])
    return tokenizer.encode(text, add_special_tokens=False)


def default_before() -> str:
    """The revision before the tenants' shares came in (this checkout's HEAD if they are
    not committed yet)."""
    added = subprocess.run(
        ["git", "log", "--format=%H", "--diff-filter=A", "--", SHARE_MODULE],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    return f"{added[-1]}^" if added else "HEAD"


def scheduler_at(rev: str):
    """The Scheduler class of scheduler.py at git revision `rev`, imported beside the
    engine package so its relative imports resolve to this checkout's modules."""
    source = subprocess.run(
        ["git", "show", f"{rev}:inference/engine/scheduler.py"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    name = "inference.engine._scheduler_before"
    spec = importlib.util.spec_from_loader(name, loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "inference.engine"
    sys.modules[name] = module
    exec(compile(source, f"{rev}:scheduler.py", "exec"), module.__dict__)
    return module.Scheduler


class Side:
    """One engine, stepped on demand; each step timed on this side's own clocks, and each
    request's arrival and first token stamped with them. Two clocks: the process's CPU time
    spent in this side's steps (the default measure: load from elsewhere on a shared machine
    barely moves it) and wall time."""

    def __init__(self, name: str, engine: LLMEngine, cpu_clock: bool):
        self.name, self.engine = name, engine
        self.cpu_clock = cpu_clock
        self.clock = 0.0  # the measuring clock: arrivals are scheduled on it
        self.other = 0.0  # the other clock
        self.arrival: dict[str, tuple[float, float]] = {}
        self.first: dict[str, tuple[float, float]] = {}
        self.pending: list[tuple[float, EngineRequest]] = []  # (when, request) in order
        self.watch: set[str] = set()  # the phase is over once these have a first token
        self.mirror: Side | None = None  # takes a copy of each request it watches, as we do

    def start(self, arrivals: list[tuple[float, EngineRequest]], watch: set[str]) -> None:
        self.pending = sorted(((self.clock + t, r) for t, r in arrivals), key=lambda a: a[0])
        self.watch = watch

    @property
    def busy(self) -> bool:
        return bool(self.pending) or not self.watch <= self.first.keys()

    def step(self) -> None:
        """Take in the requests due (an idle engine waits for the next one), then one step."""
        if self.pending and not self.engine.has_unfinished():
            idle = max(0.0, self.pending[0][0] - self.clock)
            self.clock += idle
            self.other += idle
        while self.pending and self.pending[0][0] <= self.clock:
            when, request = self.pending.pop(0)
            self.engine.add_request(request)
            # it may have waited for the step under way: that counts
            self.arrival[request.request_id] = (when, self.other - (self.clock - when))
            if self.mirror is not None and request.request_id in self.mirror.watch:
                self.mirror.engine.add_request(request)
                self.mirror.arrival[request.request_id] = (self.mirror.clock, self.mirror.other)
        if not self.engine.has_unfinished():
            return
        cpu, wall = time.process_time(), time.perf_counter()
        outputs = self.engine.step()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        self.clock += cpu if self.cpu_clock else wall
        self.other += wall if self.cpu_clock else cpu
        for out in outputs:
            if out.new_token_ids:
                self.first.setdefault(out.request_id, (self.clock, self.other))

    def ttft(self, rid: str, clock: int = 0) -> float:
        """On the measuring clock (0) or the other one (1)."""
        return self.first[rid][clock] - self.arrival[rid][clock]

    def clear(self) -> None:
        """Abort what is left of the phase, off the clock."""
        for rid in list(self.engine.requests):
            self.engine.abort(rid)
        while self.engine.has_unfinished():
            self.engine.step()


def in_turn(sides: list[Side], phase: dict[str, tuple[list, set[str]]]) -> None:
    """Run one phase on every side, one step each in turn."""
    for side in sides:
        side.start(*phase[side.name])
    while any(side.busy for side in sides):
        for side in sides:
            if side.busy:
                side.step()
    for side in sides:
        side.clear()


def request(rid: str, ids: list[int], params: SamplingParams, tenant: str) -> EngineRequest:
    return EngineRequest(rid, None, params, prompt_token_ids=ids, fairness_key=tenant)


def main():
    parser = bench_parser(
        __doc__, long_tokens=8000, shorts=6, short_max_tokens=8, prompt_logprobs=0,
        max_model_len=8192, wall=False,
    )  # fmt: skip
    parser.add_argument("--before", default=None, help="git revision (default: before the shares)")
    parser.add_argument("--budget", type=int, default=None, help="max_num_batched_tokens")
    parser.add_argument(
        "--before-budget", type=int, default=512, help="the before engine's (its cpu default)"
    )
    parser.add_argument("--threshold", type=int, default=None, help="long_prefill_token_threshold")
    args = parser.parse_args()
    base = model_dir(args.model)
    options = {"device": "cpu", "dtype": "float32", "max_model_len": args.max_model_len,
               "max_num_batched_tokens": args.budget,
               "long_prefill_token_threshold": args.threshold}  # fmt: skip
    cpu_clock = not args.wall
    sides = [Side("fair", LLMEngine(model=base, **options), cpu_clock)]
    before = default_before() if args.before is None else args.before
    if before:  # its own defaults: the budget it had, every token counted 1
        engine = LLMEngine(
            model=base, **options | {"max_num_batched_tokens": args.before_budget,
                                     "prefill_cost_context": 0}
        )  # fmt: skip
        engine.scheduler = scheduler_at(before)(
            engine.config, engine.block_manager, engine.lora_manager
        )
        sides.append(Side("before", engine, cpu_clock))
    # the short chats of phase 3 again, each on an idle engine as the fair one takes it in,
    # stepped in turn with the others: an idle TTFT measured under the same load
    idle_side = Side("idle", LLMEngine(model=base, **options), cpu_clock)
    tok = sides[0].engine.tokenizer
    short = SamplingParams(temperature=0, max_tokens=args.short_max_tokens, ignore_eos=True)
    long_params = SamplingParams(
        temperature=0, max_tokens=1, prompt_logprobs=args.prompt_logprobs or None
    )
    longs = [long_prompt(tok, args.long_tokens, rep) for rep in range(3)]
    config = sides[0].engine.config
    print(
        f"long prompt {len(longs[1])} tokens (tenant A), short chats "
        f"{len(short_prompt(tok, 'idle', 0))} tokens (tenant B); budget "
        f"{config.max_num_batched_tokens}, long_prefill_token_threshold "
        f"{config.long_prefill_token_threshold}, max_num_partial_prefills "
        f"{config.max_num_partial_prefills}; before: {before or '-'}; "
        f"torch threads {torch.get_num_threads()}",
        flush=True,
    )
    warm = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    for side in [*sides, idle_side]:  # warm-up, on prompts the measured ones share nothing with
        side.engine.generate([short_prompt(tok, "warm", 0), longs[0][:1000]], warm)

    def idle_phase(ids: list[str]) -> None:
        for i, rid in enumerate(ids):
            chat = request(rid, short_prompt(tok, rid, i), short, "B")
            in_turn(sides, {s.name: ([(0.0, chat)], {rid}) for s in sides})

    # idle chats before and after the long prompts, so a burst of load elsewhere during
    # one of them moves the idle median less
    idle_ids = [f"idle-{i}" for i in range(2 * args.shorts)]
    idle_phase(idle_ids[: args.shorts])
    in_turn(sides, {s.name: ([(0.0, request("alone", longs[1], long_params, "A"))], {"alone"})
                    for s in sides})  # fmt: skip
    beside_ids = [f"beside-{i}" for i in range(args.shorts)]
    phase = {}
    for side in sides:
        gap = side.ttft("alone") / args.shorts
        arrivals = [(0.0, request("long", longs[2], long_params, "A"))]
        arrivals += [(i * gap, request(rid, short_prompt(tok, "beside", i), short, "B"))
                     for i, rid in enumerate(beside_ids)]  # fmt: skip
        phase[side.name] = (arrivals, {"long", *beside_ids})
    phase["idle"] = ([], set(beside_ids))
    sides[0].mirror = idle_side
    in_turn([*sides, idle_side], phase)
    sides[0].mirror = None
    paired = statistics.median(idle_side.ttft(rid) for rid in beside_ids)
    idle_phase(idle_ids[args.shorts :])

    figures: dict = {"model": base.name, "long_prompt_tokens": len(longs[2]),
                     "short_prompt_tokens": len(short_prompt(tok, "beside", 0)),
                     "budget": config.max_num_batched_tokens,
                     "long_prefill_token_threshold": config.long_prefill_token_threshold,
                     "max_num_partial_prefills": config.max_num_partial_prefills,
                     "prompt_logprobs": args.prompt_logprobs, "before_rev": before or None,
                     "clock": "cpu" if cpu_clock else "wall",
                     "torch_threads": torch.get_num_threads(),
                     "short_idle_paired_ttft_s": [round(idle_side.ttft(r), 3) for r in beside_ids],
                     "short_idle_paired_median_s": round(paired, 3)}  # fmt: skip
    for side in sides:
        alone_idle = statistics.median(side.ttft(rid) for rid in idle_ids)
        idle = paired
        long_first = side.first["long"]
        during = [side.ttft(rid) for rid in beside_ids[1:] if side.arrival[rid] < long_first]
        together = side.ttft(beside_ids[0])
        f = {
            "short_idle_ttft_s": round(alone_idle, 3),  # phase 1, before and after
            "short_with_long_ttft_s": round(together, 3),
            "short_with_long_ratio": round(together / idle, 2),
            "short_during_count": len(during),
            "short_during_ttft_median_s": round(statistics.median(during), 3) if during else None,
            "short_during_ttft_max_s": round(max(during), 3) if during else None,
            "short_during_median_ratio": round(statistics.median(during) / idle, 2)
            if during
            else None,
            "short_during_max_ratio": round(max(during) / idle, 2) if during else None,
            "short_beside_ttft_s": [round(side.ttft(rid), 3) for rid in beside_ids],
            "long_alone_ttft_s": round(side.ttft("alone"), 3),
            "long_beside_ttft_s": round(side.ttft("long"), 3),
            "long_ratio": round(side.ttft("long") / side.ttft("alone"), 3),
            "other_clock": {  # the same figures on the other clock
                "short_idle_ttft_s": round(statistics.median(side.ttft(r, 1) for r in idle_ids), 3),
                "short_beside_ttft_s": [round(side.ttft(rid, 1), 3) for rid in beside_ids],
                "long_alone_ttft_s": round(side.ttft("alone", 1), 3),
                "long_beside_ttft_s": round(side.ttft("long", 1), 3),
            },
        }
        figures[side.name] = f
        print(
            f"{side.name}: short chat TTFT idle {round(paired, 3)} s (the same chats on the idle "
            f"engine; phase 1: {f['short_idle_ttft_s']} s); arriving with the "
            f"long prompt {f['short_with_long_ttft_s']} s ({f['short_with_long_ratio']}x); "
            f"arriving while it prefills ({f['short_during_count']}) median "
            f"{f['short_during_ttft_median_s']} s ({f['short_during_median_ratio']}x), max "
            f"{f['short_during_ttft_max_s']} s ({f['short_during_max_ratio']}x); long prompt "
            f"TTFT beside {f['long_beside_ttft_s']} s / alone {f['long_alone_ttft_s']} s = "
            f"{f['long_ratio']}x (goals: short <= 3x, long <= 1.3x)",
            flush=True,
        )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
