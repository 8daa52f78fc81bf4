"""Background priority: a tenant's request latency while the quality gate scores an eval set
beside it, against the same requests on an idle engine, with the background budget and
without it (the old behaviour), in one run.

    .venv/bin/python bench/background_priority.py [--model DIR] [--rows 150] [--requests 8]
        [--max-tokens 8] [--gap 1.5] [--budget -1] [--batched-tokens 0] [--threads 0]

Two engines, both with the defaults but for `background_tokens_per_step`: "budget" (the
engine's default, or --budget) and "off" (0: background work fills whatever the tenant
leaves, as before the budget existed). Each in turn, one engine in memory at a
time: first --requests tenant requests one after another on the idle engine (and as many
again once the evaluation is over, so idle is measured on both sides of it), each a short
chat prompt of its own (greedy, --max-tokens tokens, eos ignored) after a think time drawn
uniformly from 0..--gap seconds (the same draws in both phases and on both engines, so
arrivals land anywhere in a step); then an evaluation of --rows rows (the demo eval sets'
chat rows, registry/demo/data, scored the way POST /v1/internal/score scores them:
`AsyncLLMEngine.score` at Priority.BACKGROUND, 8 rows at a time, the base model alone)
starts, and the same number of fresh tenant requests run beside it with the same think
times, until they are done or the evaluation is (only requests that started and ended
while it ran count). Then the evaluation is left to finish; both engines' scores must be
the same. A request's latency runs from `generate()` to the end of its stream. Figures:
p50/p99 per phase, the ratio of the evaluation's p50 to idle's, the evaluation's seconds.
Goal: ratio <= 1.5 with the budget. The last line is one JSON object of the figures.
"""

import asyncio
import gc
import json
import random
import statistics
import time
from pathlib import Path

import torch
from common import TOPICS, bench_parser, model_dir, percentile

from inference.engine import AsyncLLMEngine, EngineRequest, LLMEngine, Priority, SamplingParams
from inference.engine.tokenizer import Tokenizer

DEMO_DATA = Path(__file__).resolve().parents[1] / "registry" / "demo" / "data"
CONCURRENCY = 8  # rows in the engine at once, as inference/operator/scoring.py sends them
Row = tuple[list[int], list[int]]  # prompt ids, completion ids


def eval_rows(tokenizer: Tokenizer, eos_ids: set[int], n: int) -> list[Row]:
    """n chat rows from the demo eval sets, in turn; each completion ends with the template's
    end-of-turn token (as the scoring endpoint scores it) when that token ends generation."""
    files = [[json.loads(line) for line in f.open()] for f in sorted(DEMO_DATA.glob("*.jsonl"))]
    rows = [r for group in zip(*files, strict=False) for r in group][:n]
    assert len(rows) == n, f"the demo eval sets hold {len(rows)} rows"
    turn = tokenizer.apply_chat_template(
        [{"role": "user", "content": "?"}, {"role": "assistant", "content": "\u2063"}]
    ).partition("\u2063")[2]
    end = tokenizer.encode(turn, add_special_tokens=False)[:1]
    end = end if end and end[0] in eos_ids else []
    return [(chat_ids(tokenizer, r["messages"]), encode(tokenizer, r["completion"]) + end)
            for r in rows]  # fmt: skip


def chat_ids(tokenizer: Tokenizer, messages: list[dict]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    return encode(tokenizer, text)


def encode(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def tenant_prompt(tokenizer: Tokenizer, phase: str, i: int) -> list[int]:
    question = f"In one sentence, what is {TOPICS[i % len(TOPICS)]}? ({phase} {i})"
    return chat_ids(tokenizer, [{"role": "user", "content": question}])


async def tenant_requests(
    engine: AsyncLLMEngine, prompts: list[list[int]], gaps: list[float], max_tokens: int, busy
) -> list[float]:
    """Each prompt after its think time, one at a time; the latencies of those that started
    and finished while `busy()` held (all of them when it always holds)."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    latencies = []
    for i, (prompt, gap) in enumerate(zip(prompts, gaps, strict=True)):
        await asyncio.sleep(gap)
        if not busy():
            break
        request = EngineRequest(f"tenant-{id(prompts)}-{i}", None, params,
                                prompt_token_ids=prompt, fairness_key="tenant")  # fmt: skip
        start = time.perf_counter()
        tokens = [t async for out in engine.generate(request) for t in out.new_token_ids]
        assert len(tokens) == max_tokens
        if busy():
            latencies.append(time.perf_counter() - start)
    return latencies


async def evaluate(engine: AsyncLLMEngine, rows: list[Row]) -> list[float]:
    """Every row's log-likelihood, at most CONCURRENCY rows in the engine at once."""
    slots = asyncio.Semaphore(CONCURRENCY)

    async def one(row: Row) -> float:
        async with slots:
            result = await engine.score(*row, priority=Priority.BACKGROUND)
            return result.logprob

    return list(await asyncio.gather(*(one(row) for row in rows)))


async def measure(engine: AsyncLLMEngine, tokenizer: Tokenizer, rows: list[Row], args) -> dict:
    """Idle, beside the evaluation, idle again (so that load from elsewhere changing
    during the run falls on both): the tenant's latencies, the evaluation's time."""
    draws = random.Random(0)
    gaps = [draws.uniform(0, args.gap) for _ in range(args.requests)]
    n, k = args.requests, args.max_tokens
    idle_prompts = [tenant_prompt(tokenizer, "idle", i) for i in range(n)]
    idle = await tenant_requests(engine, idle_prompts, gaps, k, lambda: True)
    start = time.perf_counter()
    scoring = asyncio.ensure_future(evaluate(engine, rows))
    while not engine.engine.requests:  # the evaluation's first requests are in the engine
        await asyncio.sleep(0.001)
    beside_prompts = [tenant_prompt(tokenizer, "beside", i) for i in range(n)]
    beside = await tenant_requests(engine, beside_prompts, gaps, k, lambda: not scoring.done())
    scores = await scoring
    eval_s = time.perf_counter() - start
    after_prompts = [tenant_prompt(tokenizer, "after", i) for i in range(n)]
    idle += await tenant_requests(engine, after_prompts, gaps, k, lambda: True)
    return {"idle": idle, "beside": beside, "eval_s": eval_s, "scores": scores}


def figures(run: dict) -> dict:
    def stats(values: list[float]) -> dict:
        assert values, "no tenant request ran beside the evaluation: raise --rows"
        return {"n": len(values), "p50_s": round(statistics.median(values), 3),
                "p99_s": round(percentile(values, 99), 3)}  # fmt: skip

    idle, beside = stats(run["idle"]), stats(run["beside"])
    return {
        "background_tokens_per_step": run["budget"],
        "idle": idle,
        "beside_eval": beside,
        "ratio_p50": round(beside["p50_s"] / idle["p50_s"], 2),
        "ratio_p99": round(beside["p99_s"] / idle["p99_s"], 2),
        "eval_s": round(run["eval_s"], 1),
        "latencies_idle_s": [round(x, 3) for x in run["idle"]],
        "latencies_beside_s": [round(x, 3) for x in run["beside"]],
    }


def main():
    args = bench_parser(
        __doc__, rows=150, requests=8, max_tokens=8, gap=1.5, budget=-1, batched_tokens=0,
        threads=0,
    ).parse_args()  # fmt: skip
    if args.threads:
        torch.set_num_threads(args.threads)
    base = model_dir(args.model)
    options = {"device": "cpu", "dtype": "float32", "max_model_len": 4096}
    if args.batched_tokens:
        options["max_num_batched_tokens"] = args.batched_tokens
    budgets = {"budget": None if args.budget < 0 else args.budget, "off": 0}
    runs, rows = {}, None
    for name, budget in budgets.items():
        llm = LLMEngine(model=base, background_tokens_per_step=budget, **options)
        rows = rows or eval_rows(llm.tokenizer, set(llm.eos_token_ids), args.rows)
        llm.generate([rows[0][0]], SamplingParams(max_tokens=2))  # warm-up
        engine = AsyncLLMEngine(llm)
        try:
            runs[name] = asyncio.run(measure(engine, llm.tokenizer, rows, args))
        finally:
            engine.shutdown()
        runs[name]["budget"] = llm.config.background_tokens_per_step
        prompt_tokens = len(tenant_prompt(llm.tokenizer, "idle", 0))
        print(name, json.dumps(figures(runs[name])), flush=True)
        del engine, llm
        gc.collect()
    same = runs["budget"]["scores"] == runs["off"]["scores"]
    diff = max(abs(a - b) for a, b in zip(runs["budget"]["scores"], runs["off"]["scores"],
                                          strict=True))  # fmt: skip
    tokens = [len(p) + len(c) for p, c in rows]
    result = {
        "model": base.name,
        "rows": args.rows,
        "row_tokens_mean": round(statistics.mean(tokens), 1),
        "tenant_prompt_tokens": prompt_tokens,
        "max_tokens": args.max_tokens,
        "gap_s": args.gap,
        **{name: figures(run) for name, run in runs.items()},
        "scores_identical": same,
        "scores_max_abs_diff": diff,
        "torch_threads": torch.get_num_threads(),
    }
    b, o = result["budget"], result["off"]
    print(
        f"tenant p50 beside the evaluation / idle: budget {b['ratio_p50']} "
        f"({b['beside_eval']['p50_s']} s / {b['idle']['p50_s']} s), off {o['ratio_p50']} "
        f"({o['beside_eval']['p50_s']} s / {o['idle']['p50_s']} s) (goal <= 1.5 with the "
        f"budget); evaluation {b['eval_s']} s vs {o['eval_s']} s; scores identical: {same}"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
