"""A Zipf-skewed batch on CPU: 24 requests over 12 adapters, one adapter with 8 of them, one
with 4, two with 2 and eight with 1 (Zipf-like counts, as a batch of many tenants' traffic
has them), against the same 24 requests on the base model; same engine, same prompts.

    .venv/bin/python bench/lora_zipf_batch.py [--model DIR] [--max-tokens 32] [--rounds 4]

SmolLM2-135M by default, fp32 on CPU, greedy, eos ignored. Adapters: rank 16 on all seven
projections (bench/common.py). The base and LoRA runs alternate for --rounds rounds, which
one goes first alternating too; reported: tokens/s of each, the ratio of the totals and the
median of the per-round ratios. The torch backend's layout decides this case: the segments
(8, 4, 2, 2, 1 x 8) pad badly as a whole, so a product pair per segment, or padded groups of
similar segments. The last line is one JSON object.
"""

import json
import statistics

from common import bench_parser, chat_prompts, make_adapters, model_dir
from lora_mixed_batch import engine_run

from inference.engine import LLMEngine, LoRARequest, SamplingParams

COUNTS = (8, 4, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1)  # requests per adapter


def main():
    args = bench_parser(__doc__, max_tokens=32, rounds=4).parse_args()
    base = model_dir(args.model)
    folders = make_adapters(base, len(COUNTS))
    loras = [LoRARequest(f"adapter-{i}", f"bench-{i}", str(f)) for i, f in enumerate(folders)]
    picks = [loras[i] for i, count in enumerate(COUNTS) for _ in range(count)]
    n = len(picks)
    engine = LLMEngine(model=base, device="cpu", dtype="float32", enable_lora=True,
                       max_loras=len(COUNTS), max_cpu_loras=len(COUNTS), max_num_seqs=n,
                       max_lora_rank=16)  # fmt: skip
    prompts = chat_prompts(engine.tokenizer, n)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    warm = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    engine.generate(prompts, warm, lora_request=picks)  # every adapter into its slot
    engine.generate(prompts, warm)
    totals = {"base": 0.0, "lora": 0.0}
    ratios = []
    for r in range(args.rounds):  # alternate which goes first, so drift falls on both alike
        order = [("base", [None] * n), ("lora", picks)]
        seconds = {}
        for name, requests in order if r % 2 == 0 else order[::-1]:
            seconds[name], _ = engine_run(engine, prompts, requests, params)
            totals[name] += seconds[name]
        ratios.append(seconds["base"] / seconds["lora"])
    assert engine.stats()["lora"]["evictions"]["device"] == 0
    engine.close()
    tokens = n * args.max_tokens * args.rounds
    figures = {
        "model": base.name,
        "requests": n,
        "requests_per_adapter": list(COUNTS),
        "max_tokens": args.max_tokens,
        "rounds": args.rounds,
        "base_tok_s": round(tokens / totals["base"], 1),
        "lora_tok_s": round(tokens / totals["lora"], 1),
        "lora_vs_base": round(totals["base"] / totals["lora"], 3),
        "lora_vs_base_median_round": round(statistics.median(ratios), 3),
        "lora_vs_base_rounds": [round(x, 3) for x in ratios],
    }
    print(f"base {figures['base_tok_s']} tok/s, Zipf-skewed adapters {figures['lora_tok_s']} "
          f"tok/s ({figures['lora_vs_base']} of base)")  # fmt: skip
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
