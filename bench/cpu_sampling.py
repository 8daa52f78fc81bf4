"""What sampling at a temperature costs a CPU decode step: the same batch decoded greedily and
at --temperature, side by side, and the sampler alone on that step's logits.

    .venv/bin/python bench/cpu_sampling.py [--model DIR] [--batch 64] [--steps 8]
        [--temperature 0.8] [--rounds 2]

SmolLM2-135M by default (a 49,152-token vocabulary), fp32 on CPU: --batch chat requests
decode together, eos ignored; once all of them decode, --steps decode steps are timed (the
median step), for each temperature in turn, --rounds times (which goes first alternating).
Then the sampler alone on [batch, vocab] random logits, at the temperature and greedy
(median of 5 calls). Figures: each median step, the sampler's own milliseconds, and the
sampling share of a step at the temperature, (step at T - greedy step) / step at T.
Goal: at most 0.10. The last line is one JSON object.
"""

import json
import statistics
import time
from typing import cast

import torch
from common import bench_parser, chat_prompts, model_dir

from inference.engine import EngineRequest, LLMEngine, SamplingParams
from inference.engine.sampler import Sampler
from inference.engine.sequence import Sequence
from inference.engine.tokenizer import IncrementalDetokenizer, Tokenizer

GOAL_SHARE = 0.10
NO_TEXT = cast(IncrementalDetokenizer, None)  # the sampler never detokenizes


def median_decode_step(engine: LLMEngine, prompts, temperature: float, steps: int) -> float:
    """The median time of `steps` decode steps once every request decodes."""
    for i, prompt in enumerate(prompts):
        params = SamplingParams(temperature=temperature, seed=i, max_tokens=steps + 4,
                                ignore_eos=True)  # fmt: skip
        engine.add_request(EngineRequest(f"t{temperature}-{i}", prompt_token_ids=prompt,
                                         sampling_params=params))  # fmt: skip
    while engine.scheduler.waiting or any(
        seq.num_completion_tokens == 0 for seq in engine.scheduler.running
    ):
        engine.step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    while engine.has_unfinished():
        engine.step()
    return statistics.median(times)


def sampler_ms(batch: int, vocab: int, temperature: float) -> float:
    logits = torch.randn(batch, vocab, generator=torch.Generator().manual_seed(0)) * 3
    seqs = [
        Sequence(str(i), [0], SamplingParams(temperature=temperature), seed=i, detokenizer=NO_TEXT)
        for i in range(batch)
    ]
    sampler, times = Sampler(), []
    for _ in range(5):
        start = time.perf_counter()
        sampler(logits, seqs)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main():
    args = bench_parser(__doc__, batch=64, steps=8, temperature=0.8, rounds=2).parse_args()
    base = model_dir(args.model)
    prompts = chat_prompts(Tokenizer.from_folder(base), args.batch)
    engine = LLMEngine(model=base, device="cpu", dtype="float32", max_num_seqs=args.batch)
    try:
        engine.generate([prompts[0]], SamplingParams(temperature=0, max_tokens=2))  # warm up
        steps: dict[float, list[float]] = {0.0: [], args.temperature: []}
        for r in range(args.rounds):
            order = [0.0, args.temperature] if r % 2 == 0 else [args.temperature, 0.0]
            for temperature in order:
                steps[temperature].append(
                    median_decode_step(engine, prompts, temperature, args.steps)
                )
        vocab = engine.config.model_config.vocab_size
    finally:
        engine.close()
    greedy, at_t = statistics.median(steps[0.0]), statistics.median(steps[args.temperature])
    share = (at_t - greedy) / at_t
    out = {
        "model": base.name,
        "batch": args.batch,
        "vocab": vocab,
        "temperature": args.temperature,
        "greedy_step_ms": round(1000 * greedy, 2),
        "temperature_step_ms": round(1000 * at_t, 2),
        "sampling_share_of_step": round(share, 4),
        "sampler_ms_greedy": round(sampler_ms(args.batch, vocab, 0.0), 2),
        "sampler_ms_temperature": round(sampler_ms(args.batch, vocab, args.temperature), 2),
        "goal_share": GOAL_SHARE,
        "goal_met": share <= GOAL_SHARE,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
