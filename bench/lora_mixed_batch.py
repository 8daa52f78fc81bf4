"""Mixed-adapter batch throughput: 8 requests on 8 distinct adapters against 8 on the base
model (same engine, same prompts, one run), and against PEFT's own mixed-adapter batch.

    .venv/bin/python bench/lora_mixed_batch.py [--model DIR] [--max-tokens 64] [--rounds 4]

SmolLM2-135M by default, fp32 on CPU, greedy, eos ignored so every request makes exactly
--max-tokens tokens. Adapters: rank 16 on all seven projections (bench/common.py).
The engine's base and LoRA runs alternate for --rounds rounds, which one goes first
alternating too; each run times prefill and decode, wall clock. The machine is shared, so
besides the ratio of the totals the median of the per-round ratios is reported (a burst of
load from elsewhere skews one round, not the median).
PEFT runs `generate(..., adapter_names=[...])` three times on a left-padded batch of the
same prompts; its median run is compared with the engine's median LoRA round. Goals: LoRA
>= 0.85 of base tokens/s; >= 2x PEFT. The last line is one JSON object.
"""

import json
import statistics
import time

import torch
from common import bench_parser, chat_prompts, make_adapters, model_dir

from inference.engine import LLMEngine, LoRARequest, SamplingParams

N = 8


def engine_run(engine, prompts, loras, params) -> tuple[float, list[list[int]]]:
    start = time.perf_counter()
    outs = engine.generate(prompts, params, lora_request=loras)
    seconds = time.perf_counter() - start
    assert all(o.error is None and len(o.token_ids) == params.max_tokens for o in outs)
    return seconds, [o.token_ids for o in outs]


def peft_runs(base, folders, prompts, max_tokens, pad, runs) -> tuple[list[float], list]:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    model = PeftModel.from_pretrained(model, str(folders[0]), adapter_name="a0")
    for i, folder in enumerate(folders[1:], 1):
        model.load_adapter(str(folder), adapter_name=f"a{i}")
    model.eval()
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    names = [f"a{i}" for i in range(len(prompts))]
    kwargs = {"do_sample": False, "pad_token_id": pad, "adapter_names": names}
    with torch.inference_mode():
        model.generate(input_ids=ids[:, -8:], attention_mask=mask[:, -8:], max_new_tokens=2,
                       **kwargs)  # fmt: skip
        seconds = []
        for _ in range(runs):
            start = time.perf_counter()
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_tokens,
                                 **kwargs)  # fmt: skip
            seconds.append(time.perf_counter() - start)
    return seconds, out[:, width:].tolist()


def main():
    parser = bench_parser(__doc__, max_tokens=64, rounds=4, skip_peft=False)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    base = model_dir(args.model)
    folders = make_adapters(base, N)
    engine = LLMEngine(model=base, device="cpu", dtype="float32", enable_lora=True,
                       max_loras=N, max_cpu_loras=2 * N, max_lora_rank=16)  # fmt: skip
    loras = [LoRARequest(f"adapter-{i}", f"bench-{i}", str(f)) for i, f in enumerate(folders)]
    prompts = chat_prompts(engine.tokenizer, N)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    warm = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    engine.generate(prompts, warm, lora_request=loras)  # loads all 8 into their slots
    engine.generate(prompts, warm)
    base_s = lora_s = 0.0
    ratios, lora_rates = [], []
    for r in range(args.rounds):  # alternate which goes first, so drift falls on both alike
        order = [("base", [None] * N), ("lora", loras)]
        seconds = {}
        for name, loras_or_none in order if r % 2 == 0 else order[::-1]:
            seconds[name], tokens = engine_run(engine, prompts, loras_or_none, params)
            if name == "base":
                base_tokens = tokens
            else:
                lora_tokens = tokens
        base_s += seconds["base"]
        lora_s += seconds["lora"]
        ratios.append(seconds["base"] / seconds["lora"])
        lora_rates.append(N * args.max_tokens / seconds["lora"])
    total = N * args.max_tokens * args.rounds
    stats = engine.stats()["lora"]
    assert stats["loads"] == N and stats["evictions"]["device"] == 0
    figures = {
        "model": base.name,
        "requests": N,
        "adapters": N,
        "max_tokens": args.max_tokens,
        "prompt_tokens": sum(map(len, prompts)),
        "rounds": args.rounds,
        "base_tok_s": round(total / base_s, 1),
        "lora_tok_s": round(total / lora_s, 1),
        "lora_vs_base": round(base_s / lora_s, 3),
        "lora_vs_base_median_round": round(statistics.median(ratios), 3),
        "lora_vs_base_rounds": [round(x, 3) for x in ratios],
        "outputs_differ_from_base": sum(
            a != b for a, b in zip(lora_tokens, base_tokens, strict=True)
        ),
        "torch_threads": torch.get_num_threads(),
    }
    print(f"engine base: {figures['base_tok_s']} tok/s, 8 adapters: {figures['lora_tok_s']} "
          f"tok/s ({figures['lora_vs_base']} of base)")  # fmt: skip
    if not args.skip_peft:
        pad = engine.tokenizer.eos_token_ids[0]
        peft_s, peft_tokens = peft_runs(base, folders, prompts, args.max_tokens, pad, 3)
        peft_rate = N * args.max_tokens / statistics.median(peft_s)
        figures["peft_tok_s"] = round(peft_rate, 1)  # median of 3 runs
        figures["lora_tok_s_median_round"] = round(statistics.median(lora_rates), 1)
        figures["lora_vs_peft"] = round(statistics.median(lora_rates) / peft_rate, 2)
        figures["identical_to_peft"] = sum(
            a == b for a, b in zip(lora_tokens, peft_tokens, strict=True)
        )
        print(
            f"PEFT mixed batch: {figures['peft_tok_s']} tok/s; engine is "
            f"{figures['lora_vs_peft']}x; {figures['identical_to_peft']}/{N} outputs identical"
        )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
