"""Engine throughput against transformers `generate`, side by side in one process.

    .venv/bin/python bench/engine_throughput.py [--model DIR] [--requests 16] [--max-tokens 128]

Greedy, fp32, the same token-id prompts of mixed lengths for both; every request makes
exactly --max-tokens tokens (eos ignored) so both do the same work. transformers runs them
as one left-padded batch. The machine is shared, so the two runs are interleaved: each time
`generate` finishes a step, it hands over to one engine step (through its streamer hook), and
each side's time is summed on its own. Load from elsewhere then falls on both alike.

Prints tokens/s for both, the ratio, the engine's TTFT p50 (on its own clock; every request
arrives at once) and peak RSS; the last line is one JSON object with the figures.
"""

import json
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from common import bench_parser, chat_prompts, model_dir  # noqa: E402

from inference.engine import EngineRequest, LLMEngine, SamplingParams  # noqa: E402

FILLER = (
    "Please be precise, use simple words, and give one concrete example that a curious "
    "student could check at home. "
)


def build_prompts(engine: LLMEngine, n: int) -> list[list[int]]:
    """Chat prompts whose lengths spread from a short question to a few hundred tokens."""
    return chat_prompts(engine.tokenizer, n, FILLER, repeats=lambda i: i * 13 % 17)


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class EngineRun:
    """The engine's side: all requests added at once, then stepped on demand."""

    def __init__(self, engine: LLMEngine, prompts, max_tokens: int):
        self.engine = engine
        self.tokens: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
        self.ttft: dict[str, float] = {}
        self.seconds = 0.0
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        for i, p in enumerate(prompts):
            engine.add_request(EngineRequest(str(i), prompt_token_ids=p, sampling_params=params))

    def step(self):
        if not self.engine.has_unfinished():
            return
        start = time.perf_counter()
        outputs = self.engine.step()
        self.seconds += time.perf_counter() - start
        for out in outputs:
            self.ttft.setdefault(out.request_id, self.seconds)
            self.tokens[out.request_id] += out.new_token_ids


class Interleave:
    """A transformers streamer: `generate` calls `put` after each of its steps (and once with
    the prompt); we stop its clock there, run one engine step, and restart it."""

    def __init__(self, other: EngineRun):
        self.other = other
        self.seconds = 0.0
        self.mark = time.perf_counter()

    def put(self, _tokens):
        self.seconds += time.perf_counter() - self.mark
        self.other.step()
        self.mark = time.perf_counter()

    def end(self):
        self.seconds += time.perf_counter() - self.mark


def main():
    args = bench_parser(__doc__, requests=16, max_tokens=128).parse_args()
    args.model = str(model_dir(args.model))

    engine = LLMEngine(model=args.model, device="cpu", dtype="float32")
    prompts = build_prompts(engine, args.requests)
    lengths = [len(p) for p in prompts]
    print(
        f"{args.requests} requests, prompt tokens {min(lengths)}..{max(lengths)} "
        f"(total {sum(lengths)}), {args.max_tokens} new tokens each, "
        f"torch threads {torch.get_num_threads()}"
    )
    # Warm-up on the real prompts: also sizes the engine's own peak memory before the
    # reference model joins the process.
    engine.generate(prompts, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    engine_rss = peak_rss_mib()

    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # eos is an ordinary token here, as with ignore_eos
    hf.generate(input_ids=torch.tensor([prompts[0][:8]]), max_new_tokens=2, do_sample=False)
    pad = engine.tokenizer.eos_token_ids[0]
    width = max(lengths)
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])

    ours = EngineRun(engine, prompts, args.max_tokens)
    theirs = Interleave(ours)
    with torch.inference_mode():
        out = hf.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            max_new_tokens=args.max_tokens,
            do_sample=False,
            pad_token_id=pad,
            streamer=theirs,
        )
    while engine.has_unfinished():  # normally done already: both take max_tokens steps
        ours.step()
    hf_tokens = out[:, width:].tolist()

    total = args.requests * args.max_tokens
    assert sum(map(len, ours.tokens.values())) == total == sum(map(len, hf_tokens))
    figures = {
        "model": Path(args.model).name,
        "requests": args.requests,
        "max_tokens": args.max_tokens,
        "prompt_tokens": sum(lengths),
        "engine_tok_s": round(total / ours.seconds, 1),
        "transformers_tok_s": round(total / theirs.seconds, 1),
        "ratio": round(theirs.seconds / ours.seconds, 2),
        "engine_ttft_p50_s": round(statistics.median(ours.ttft.values()), 3),
        "engine_peak_rss_mib": round(engine_rss),
        "peak_rss_mib": round(peak_rss_mib()),
        "identical_outputs": sum(
            a == b for a, b in zip(ours.tokens.values(), hf_tokens, strict=True)
        ),
        "torch_threads": torch.get_num_threads(),
    }
    print(f"engine:       {figures['engine_tok_s']:8.1f} tok/s  ({ours.seconds:.1f} s)")
    print(f"transformers: {figures['transformers_tok_s']:8.1f} tok/s  ({theirs.seconds:.1f} s)")
    print(
        f"ratio {figures['ratio']}x, engine TTFT p50 {figures['engine_ttft_p50_s']} s, "
        f"peak RSS {figures['engine_peak_rss_mib']} MiB (engine alone) / "
        f"{figures['peak_rss_mib']} MiB (both models), "
        f"{figures['identical_outputs']}/{args.requests} outputs identical"
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
