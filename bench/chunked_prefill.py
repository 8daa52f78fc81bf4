"""Chunked prefill: how long eight decoding streams stall while a 3,000-token prompt is
prefilled, with chunked prefill against without, side by side in one process.

    .venv/bin/python bench/chunked_prefill.py [--model DIR] [--budget 512] [--reps 4]
        [--streams 8] [--long-tokens 3000] [--profile]

Each repetition: --streams short chat requests (greedy, eos ignored, long max_tokens)
start decoding; once each has made 8 tokens, a chat request of --long-tokens tokens (a
support handbook to summarise, different every repetition so the prefix cache never helps)
arrives, and stepping goes on until it has its first token; then everything is aborted.
The stall is the longest gap between two consecutive tokens of any stream among the gaps
that overlap the long prompt's prefill (from its arrival to its first token); the long
prompt's TTFT runs from its arrival to its first token. Two engines, both with the
defaults but for chunked prefill: on, with --budget tokens per step (default 512, the
engine's CPU default), and off (a prompt prefilled whole in one step, budget
max(max_model_len, 2048)). Both get the same requests at once and step in turn, one step
each (which one goes first alternates by repetition); every step is timed on its own
engine's clock and every token stamped with that clock, so gaps and TTFT are each
engine's own, and load from elsewhere on this shared machine falls on both alike. Figures
are medians over the repetitions (each repetition's own ratios are listed too). --profile
adds, per engine, where the prefill steps' time goes (torch profiler, self CPU time by op
group); the decode-only step time of the same streams is always reported for comparison.
Goals: stall chunked / unchunked <= 0.25; long TTFT chunked / unchunked <= 1.3.
The last line is one JSON object of the figures.
"""

import json
import statistics
import time
from collections import defaultdict

import torch
from common import bench_parser, chat_prompts, model_dir
from prefix_cache import system_prompt

from inference.engine import EngineRequest, LLMEngine, SamplingParams

WARM_TOKENS = 8  # tokens each stream makes before the long prompt arrives
OP_GROUPS = {
    "aten::mm": "matmul",
    "aten::addmm": "matmul",
    "aten::bmm": "matmul",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "attention",
    "aten::_scaled_dot_product_attention_math": "attention",
    "aten::index": "gather (index)",
    "aten::index_copy_": "kv store",
}


def long_prompt(tokenizer, n_tokens: int, rep: int) -> list[int]:
    """A chat request of about n_tokens tokens, its first block unique to `rep`."""
    system = f"Request {rep}. You summarise documents for a support team."
    question = "Summarise the handbook below in five bullet points.\n\n"
    handbook = system_prompt(tokenizer, n_tokens - 33, company=f"Shop {rep}")
    messages = [{"role": "system", "content": system},
                {"role": "user", "content": question + handbook}]  # fmt: skip
    text = tokenizer.apply_chat_template(messages)
    return tokenizer.encode(text, add_special_tokens=False)


class Side:
    """One engine, stepped on demand; every step timed on this side's own clock, and every
    token stamped with that clock."""

    def __init__(self, engine: LLMEngine, profile: bool):
        self.engine, self.profile = engine, profile
        self.clock = 0.0
        self.times: dict[str, list[float]] = defaultdict(list)
        self.step_s: list[float] = []  # the last phase's step times
        self.cpu_s: dict[str, float] = defaultdict(float)  # self CPU time by op group

    def step(self, profile: bool = False) -> None:
        if not self.engine.has_unfinished():
            return
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        if profile:
            prof.start()
        start = time.perf_counter()
        outputs = self.engine.step()
        seconds = time.perf_counter() - start
        if profile:
            prof.stop()
            for event in prof.key_averages():
                self.cpu_s[OP_GROUPS.get(event.key, "other")] += event.self_cpu_time_total / 1e6
        self.clock += seconds
        self.step_s.append(seconds)
        for out in outputs:
            self.times[out.request_id] += [self.clock] * len(out.new_token_ids)


def in_turn(sides: list[Side], busy, profile: bool = False) -> None:
    """Step the sides in turn, one step each, each only while `busy(side)`."""
    for side in sides:
        side.step_s = []
    while any(busy(side) for side in sides):
        for side in sides:
            if busy(side):
                side.step(profile)


def one_rep(sides: dict[str, Side], streams, long_ids, rep: int, profile: bool) -> dict:
    """Streams decoding on both engines, then the long prompt on both at once; per engine
    the stall, the long prompt's TTFT and the prefill steps' times."""
    params = SamplingParams(temperature=0, max_tokens=1000, ignore_eos=True)
    ids = [f"{rep}-s{i}" for i in range(len(streams))]
    long_id = f"{rep}-long"
    order = list(sides.values()) if rep % 2 == 0 else list(sides.values())[::-1]
    for side in order:
        for rid, prompt in zip(ids, streams, strict=True):
            side.engine.add_request(EngineRequest(rid, None, params, prompt_token_ids=prompt))
    in_turn(order, lambda side: min(len(side.times[r]) for r in ids) < WARM_TOKENS)
    decode_s = {}
    for side in order:  # decode-only steps of the same streams, for comparison
        side.step_s = []
        for _ in range(3):
            side.step()
        decode_s[id(side)] = statistics.median(side.step_s)
    long_params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    arrival = {}
    for side in order:
        side.engine.add_request(
            EngineRequest(long_id, None, long_params, prompt_token_ids=long_ids)
        )
        arrival[id(side)] = side.clock
    in_turn(order, lambda side: not side.times[long_id], profile)
    prefill_s = {id(side): side.step_s for side in order}
    results = {}
    for name, side in sides.items():
        first = side.times[long_id][0]
        start = arrival[id(side)]
        for rid in ids + [long_id]:
            side.engine.abort(rid)
        while side.engine.has_unfinished():
            side.engine.step()
        gaps, before = [], []
        for rid in ids:
            t = side.times.pop(rid)
            gaps += [b - a for a, b in zip(t, t[1:], strict=False) if b > start and a < first]
            before += [b - a for a, b in zip(t, t[1:], strict=False) if b <= start]
        results[name] = {
            "max_gap_s": round(max(gaps), 3),
            "ttft_s": round(first - start, 3),
            "steps": len(prefill_s[id(side)]),
            "step_s": [round(x, 3) for x in prefill_s[id(side)]],
            "decode_step_s": round(decode_s[id(side)], 3),
            "decode_gap_before_s": round(statistics.median(before), 3),
        }
        side.times.pop(long_id)
    return results


def main():
    args = bench_parser(
        __doc__, budget=512, reps=4, streams=8, long_tokens=3000, profile=False
    ).parse_args()
    base = model_dir(args.model)
    common = {"device": "cpu", "dtype": "float32", "max_model_len": 4096}
    engines = {
        "chunked": LLMEngine(
            model=base, enable_chunked_prefill=True, max_num_batched_tokens=args.budget, **common
        ),
        "unchunked": LLMEngine(model=base, enable_chunked_prefill=False, **common),
    }
    tok = engines["chunked"].tokenizer
    streams = chat_prompts(tok, args.streams)
    budgets = {k: e.config.max_num_batched_tokens for k, e in engines.items()}
    warm = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    for e in engines.values():  # warm-up, on prompts the measured ones share nothing with
        e.generate(streams[:1] + [long_prompt(tok, 1000, -1)], warm)
    lengths = [len(long_prompt(tok, args.long_tokens, r)) for r in range(args.reps)]
    print(
        f"{args.streams} streams (prompts {min(map(len, streams))}..{max(map(len, streams))} "
        f"tokens), long prompt {min(lengths)}..{max(lengths)} tokens, budgets {budgets}, "
        f"torch threads {torch.get_num_threads()}",
        flush=True,
    )
    sides = {name: Side(e, args.profile) for name, e in engines.items()}
    runs: dict[str, list[dict]] = {name: [] for name in engines}
    for rep in range(args.reps):  # a new long prompt each time: nothing cached from before
        result = one_rep(sides, streams, long_prompt(tok, args.long_tokens, rep), rep,
                         args.profile)  # fmt: skip
        for name, r in result.items():
            runs[name].append(r)
        print(json.dumps(result), flush=True)

    def median(name, key):
        return round(statistics.median(r[key] for r in runs[name]), 3)

    def per_rep(key):  # chunked / unchunked within each repetition, measured together
        pairs = zip(runs["chunked"], runs["unchunked"], strict=True)
        return [round(c[key] / u[key], 3) for c, u in pairs]

    c_gap, u_gap = median("chunked", "max_gap_s"), median("unchunked", "max_gap_s")
    c_ttft, u_ttft = median("chunked", "ttft_s"), median("unchunked", "ttft_s")
    figures = {
        "model": base.name,
        "streams": args.streams,
        "long_prompt_tokens": lengths[0],
        "budget_chunked": budgets["chunked"],
        "budget_unchunked": budgets["unchunked"],
        "reps": args.reps,
        "max_gap_chunked_s": c_gap,
        "max_gap_unchunked_s": u_gap,
        "gap_ratio": round(c_gap / u_gap, 3),
        "ttft_chunked_s": c_ttft,
        "ttft_unchunked_s": u_ttft,
        "ttft_ratio": round(c_ttft / u_ttft, 3),
        "rep_gap_ratios": per_rep("max_gap_s"),
        "rep_ttft_ratios": per_rep("ttft_s"),
        "decode_step_chunked_s": median("chunked", "decode_step_s"),
        "decode_step_unchunked_s": median("unchunked", "decode_step_s"),
        "runs": runs,
        "torch_threads": torch.get_num_threads(),
    }
    if args.profile:  # self CPU seconds of the prefill steps, all repetitions together
        figures["profile_cpu_s"] = {
            name: {k: round(v, 2) for k, v in sorted(side.cpu_s.items())}
            for name, side in sides.items()
        }
        print("profile", json.dumps(figures["profile_cpu_s"]))
    print(
        f"stall (longest gap) chunked {c_gap} s / unchunked {u_gap} s = {figures['gap_ratio']} "
        f"(goal <= 0.25); long prompt TTFT {c_ttft} s / {u_ttft} s = {figures['ttft_ratio']} "
        f"(goal <= 1.3); budget {budgets['chunked']}; per repetition: gap "
        f"{figures['rep_gap_ratios']}, TTFT {figures['rep_ttft_ratios']}"
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
