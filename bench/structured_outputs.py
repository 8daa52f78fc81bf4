"""Structured outputs: decode throughput of a batch held to a JSON schema against the same
batch unconstrained, side by side in one process; and what a schema costs to compile.

    .venv/bin/python bench/structured_outputs.py [--model DIR] [--requests 8]
        [--max-tokens 64] [--repeats 5]

--requests chat prompts (support-desk orders to write up as JSON), each sampled at
temperature 0.8 / top-p 0.95 with its own seed: on one engine unconstrained (eos ignored),
on a second engine (same model, same settings; the two swap roles each repetition) with a
JSON schema (an order with at least 12 line items, so every JSON is still open at
--max-tokens and both produce the same number of tokens). The two engines step in turn, one
step each, every step timed on its own engine's clock, so load from elsewhere on this shared
machine falls on both alike; tokens/s is generated tokens over the summed step time, per
repetition (--repeats, fresh requests each time), and the ratio is constrained /
unconstrained of the medians. The grammar is compiled before the first step (the cache then
serves every request, as it does in serving once a schema has been seen).

The grammar's own cost per constrained step is timed too (filling and applying the token
masks of the batch, and advancing its matchers), so the ratio on a quieter machine, whose
steps are shorter, can be told from it.

Compile: the grammar engine's one-time setup (llguidance reads the tokenizer), then a
schema compiled cold (a schema not seen before: each time a new title) and cached (the
same schema again), medians of 10.
Goal: tokens/s constrained / unconstrained >= 0.9. The last line is one JSON object of the
figures.
"""

import json
import statistics
import time
from typing import Any

import torch
from common import bench_parser, model_dir

from inference.engine import (
    EngineRequest,
    LLMEngine,
    SamplingParams,
    StructuredOutput,
    grammar_mask,
)
from inference.engine.grammar import GrammarMatcher

ORDER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string", "pattern": "^[0-9]{5}$"},
        "customer": {"type": "string", "maxLength": 40},
        "status": {"enum": ["open", "shipped", "delivered", "returned"]},
        "items": {
            "type": "array",
            "minItems": 12,
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{4}$"},
                    "name": {"type": "string", "maxLength": 40},
                    "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
                    "price_eur": {"type": "number", "minimum": 0},
                },
                "required": ["sku", "name", "quantity", "price_eur"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["order_id", "customer", "status", "items"],
    "additionalProperties": False,
}
ORDERS = [
    "Order 48213 from Jana Novak: a two-person tent, two sleeping mats and a camping stove.",
    "Order 51870 from Luca Rossi: a rain jacket, hiking boots and three pairs of socks.",
    "Order 50331 from Emma Berg: a trekking backpack, a water filter and a head torch.",
    "Order 49902 from Tom Weber: a bicycle helmet, two inner tubes and a bike lock.",
    "Order 47718 from Sofia Lind: a down sleeping bag, a pillow and a compression sack.",
    "Order 52044 from Ahmed Saleh: trail running shoes, a running vest and two gels.",
    "Order 46690 from Marie Dubois: a fleece, a beanie, gloves and a thermos flask.",
    "Order 53127 from Piotr Zielinski: a camping table, four chairs and a lantern.",
]


def chat_prompts(engine: LLMEngine, n: int) -> list[list[int]]:
    prompts = []
    for i in range(n):
        order = ORDERS[i % len(ORDERS)]
        messages = [
            {
                "role": "user",
                "content": f"Write this order up as JSON, one line item per product: {order}",
            }
        ]
        prompts.append(engine.tokenizer.encode(engine.tokenizer.apply_chat_template(messages)))
    return prompts


class GrammarClock:
    """Times the grammar's part of each step: the sampler's mask_logits and every matcher's
    accept, wrapped in place for the length of the benchmark."""

    def __init__(self) -> None:
        self.seconds = 0.0
        mask_logits, accept = grammar_mask.mask_logits, GrammarMatcher.accept

        def timed_mask(*args: Any) -> Any:
            start = time.perf_counter()
            try:
                return mask_logits(*args)
            finally:
                self.seconds += time.perf_counter() - start

        def timed_accept(matcher: GrammarMatcher, token_id: int) -> bool:
            start = time.perf_counter()
            try:
                return accept(matcher, token_id)
            finally:
                self.seconds += time.perf_counter() - start

        grammar_mask.mask_logits = timed_mask  # type: ignore[assignment]
        GrammarMatcher.accept = timed_accept  # type: ignore[method-assign,assignment]


class Side:
    """One engine's run of the batch, its steps timed one by one."""

    def __init__(self, engine: LLMEngine, prompts: list[list[int]], params: list[SamplingParams]):
        self.engine = engine
        self.seconds = 0.0
        self.tokens = 0
        self.finish: set[str] = set()
        self.texts: dict[str, str] = {}
        for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
            engine.add_request(EngineRequest(f"r{i}", prompt_token_ids=prompt, sampling_params=p))

        self.steps = 0

    def step(self) -> None:
        start = time.perf_counter()
        outputs = self.engine.step()
        self.seconds += time.perf_counter() - start
        self.steps += 1
        for out in outputs:
            self.tokens += len(out.new_token_ids)
            self.texts[out.request_id] = self.texts.get(out.request_id, "") + out.new_text
            if out.finish_reason is not None:
                self.finish.add(out.finish_reason)


def compile_times(engine: LLMEngine) -> dict[str, float]:
    start = time.perf_counter()
    engine.structured.compile(StructuredOutput.any_json_object())  # builds the backend
    setup_s = time.perf_counter() - start
    cold, cached = [], []
    for i in range(10):
        spec = StructuredOutput.from_schema({**ORDER_SCHEMA, "title": f"order {i}"})
        start = time.perf_counter()
        engine.structured.compile(spec)
        cold.append(time.perf_counter() - start)
        start = time.perf_counter()
        engine.structured.compile(spec).matcher()  # what a request with a cached schema pays
        cached.append(time.perf_counter() - start)
    return {
        "backend_setup_s": setup_s,
        "compile_cold_ms_p50": 1000 * statistics.median(cold),
        "compile_cached_ms_p50": 1000 * statistics.median(cached),
    }


def main() -> None:
    args = bench_parser(__doc__ or "", requests=8, max_tokens=64, repeats=5).parse_args()
    folder = model_dir(args.model)
    pair = [LLMEngine(model=folder, kv_cache_bytes=256 << 20) for _ in range(2)]
    prompts = chat_prompts(pair[0], args.requests)
    compiles = compile_times(pair[0])
    print(
        f"grammar backend setup {compiles['backend_setup_s']:.2f} s; compile cold "
        f"{compiles['compile_cold_ms_p50']:.2f} ms, cached {compiles['compile_cached_ms_p50']:.3f}"
        f" ms (p50)",
        flush=True,
    )
    spec = StructuredOutput.from_schema(ORDER_SCHEMA)
    for engine in pair:
        engine.structured.compile(spec)
        engine.generate(prompts[:2], SamplingParams(max_tokens=4))  # warm-up

    def params(structured: StructuredOutput | None) -> list[SamplingParams]:
        return [
            SamplingParams(
                temperature=0.8,
                top_p=0.95,
                seed=i,
                max_tokens=args.max_tokens,
                ignore_eos=structured is None,
                structured_output=structured,
            )
            for i in range(args.requests)
        ]

    runs: dict[str, list[Side]] = {"unconstrained": [], "json_schema": []}
    clock = GrammarClock()
    for rep in range(args.repeats):
        # the engines swap roles (and which steps first) each time, so neither favours a side
        first, second = pair if rep % 2 == 0 else pair[::-1]
        sides = {
            "unconstrained": Side(first, prompts, params(None)),
            "json_schema": Side(second, prompts, params(spec)),
        }
        order = list(sides) if rep % 2 == 0 else list(reversed(sides))
        while any(side.engine.has_unfinished() for side in sides.values()):
            for name in order:
                if sides[name].engine.has_unfinished():
                    sides[name].step()
        for name, side in sides.items():
            runs[name].append(side)
            print(
                f"rep {rep} {name:13s} {side.tokens} tokens in {side.seconds:.2f} s: "
                f"{side.tokens / side.seconds:.1f} tokens/s, finish {sorted(side.finish)}",
                flush=True,
            )
    grammar_ms = 1000 * clock.seconds / sum(side.steps for side in runs["json_schema"])
    step_ms = {
        name: 1000 * statistics.median(side.seconds / side.steps for side in sides)
        for name, sides in runs.items()
    }
    print(
        f"per step p50: unconstrained {step_ms['unconstrained']:.1f} ms, json_schema "
        f"{step_ms['json_schema']:.1f} ms, of which the grammar {grammar_ms:.2f} ms (mean)"
    )
    print("a constrained output:", runs["json_schema"][0].texts["r0"][:160])
    median = {
        name: statistics.median(side.tokens / side.seconds for side in sides)
        for name, sides in runs.items()
    }
    ratio = median["json_schema"] / median["unconstrained"]
    print(
        f"tokens/s p50: json_schema {median['json_schema']:.1f}, unconstrained "
        f"{median['unconstrained']:.1f}; ratio {ratio:.3f} (goal >= 0.9)"
    )
    figures = {
        "model": folder.name,
        "requests": args.requests,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "tokens_per_s_json_schema_p50": median["json_schema"],
        "tokens_per_s_unconstrained_p50": median["unconstrained"],
        "ratio": ratio,
        "goal_met": ratio >= 0.9,
        "step_ms_unconstrained_p50": step_ms["unconstrained"],
        "step_ms_json_schema_p50": step_ms["json_schema"],
        "grammar_ms_per_step_mean": grammar_ms,
        "json_schema_finish": sorted({f for side in runs["json_schema"] for f in side.finish}),
        "tokens_per_run": {name: sides[0].tokens for name, sides in runs.items()},
        **compiles,
        "torch_threads": torch.get_num_threads(),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
