"""Quantized bases on CPU: SmolLM2 quantized by llmcompressor, beside the unquantized base.

    .venv/bin/python bench/quantized_bases.py [--model DIR] [--requests 8] [--max-tokens 32]
        [--rounds 2] [--rows 0]

The bundled SmolLM2-135M (an fp32 HF folder converted from its GGUF) is loaded in bf16 and
quantized in the quantizing venv (`.venv/quantize`, `make .venv/quantize/.installed`) with
llmcompressor's data-free schemes, lm_head left out as published checkpoints leave it:
FP8_DYNAMIC (per-channel FP8 weights, per-token FP8 activations), W4A16 and W8A16 (integer
weights, symmetric). Both integer schemes use groups of 64, not the presets' 128: SmolLM2's
hidden size, 576, is the input of q/k/v and gate/up, and 128 does not divide it. Folders
are made once and reused (under $LORAPLEX_VAR_DIR/bench-quantized, default var/).

Then, in this venv, for the unquantized base and each quantized folder:
- resident weight bytes, the engine's own figure (`weights_bytes`), loaded in bf16, the
  dtype a GPU serves in, and its ratio to the unquantized base's;
- decode tokens/s on CPU in fp32 (the demo's dtype): the same --requests chat prompts at
  once, greedy, --max-tokens each (eos ignored), counting only the steps after every prompt
  has its first token; the models take turns for --rounds rounds (load from elsewhere falls
  on all alike) and each keeps its best round;
- perplexity of the completions of the demo eval sets (registry/demo/eval), scored as the
  quality gate scores a row (`LLMEngine.score`: the chat prompt, then the completion and the
  template's end-of-turn token), per set and over all rows (--rows N: the first N of each).

The last line is one JSON object with the figures.
"""

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import bench_parser, chat_prompts, model_dir  # noqa: E402

EVAL_SETS = ROOT / "registry" / "demo" / "eval"
QUANTIZE_PYTHON = ROOT / ".venv" / "quantize" / "bin" / "python"
MIN_LOGPROB = -9999.0  # as the scoring endpoint clamps a token's logprob (JSON has no -inf)
KV_CACHE_BYTES = 64 << 20


def _weights(num_bits: int, group_size: int) -> dict:
    args = {"num_bits": num_bits, "type": "int", "symmetric": True, "strategy": "group",
            "group_size": group_size, "dynamic": False}  # fmt: skip
    return {"config_groups": {"group_0": {"targets": ["Linear"], "weights": args}}}


# folder name -> llmcompressor QuantizationModifier keywords
SCHEMES = {
    "fp8-dynamic": {"scheme": "FP8_DYNAMIC"},
    "w4a16-g64": _weights(4, 64),
    "w8a16-g64": _weights(8, 64),
}


# ---------------------------------------------------------------- quantizing (the other venv)


def quantize_child(base: Path, out: Path, scheme: str) -> None:
    """Runs in the quantizing venv: one data-free llmcompressor pass, saved compressed."""
    import torch

    from tests.quantized.make_checkpoints import quantize

    quantize(base, out, "quantization", SCHEMES[scheme], False, torch.bfloat16)


def quantized_folders(base: Path, names: list[str]) -> dict[str, Path]:
    """Each scheme's folder, quantized on first use (in a scratch folder renamed into place)."""
    from tests.smollm2 import var_dir

    root = var_dir() / "bench-quantized" / base.name
    folders = {name: root / name for name in names}
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    for name, folder in folders.items():
        if (folder / "config.json").is_file():
            continue
        if not QUANTIZE_PYTHON.is_file():
            sys.exit(f"{QUANTIZE_PYTHON} is missing: run `make .venv/quantize/.installed`")
        scratch = folder.with_name(folder.name + ".partial")
        start = time.perf_counter()
        command = [str(QUANTIZE_PYTHON), __file__, "--quantize", name, str(base), str(scratch)]
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"quantizing {name} failed:\n{done.stderr[-4000:]}")
        scratch.rename(folder)
        print(f"quantized {name} in {time.perf_counter() - start:.0f} s")
    return folders


# ---------------------------------------------------------------- measuring (this venv)


def resident_bytes(folder: Path) -> int:
    """The engine's figure for the weights, loaded in bf16."""
    from inference.engine import LLMEngine

    engine = LLMEngine(model=str(folder), device="cpu", dtype="bfloat16",
                       kv_cache_bytes=1 << 20)  # fmt: skip
    try:
        return engine.model_runner.weights_bytes
    finally:
        engine.close()


def decode_tok_s(engine, prompts: list[list[int]], max_tokens: int) -> tuple[float, list]:
    """Tokens per second of the steps after every prompt has its first token; the outputs."""
    from inference.engine import EngineRequest, SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    tokens: dict[str, list[int]] = {}
    for i, prompt in enumerate(prompts):
        request_id = f"decode-{time.monotonic_ns()}-{i}"
        tokens[request_id] = []
        engine.add_request(EngineRequest(request_id, prompt_token_ids=prompt,
                                         sampling_params=params))  # fmt: skip
    seconds, decoded = 0.0, 0
    while engine.has_unfinished():
        prefilled = all(tokens.values())
        start = time.perf_counter()
        outputs = engine.step()
        elapsed = time.perf_counter() - start
        for out in outputs:
            tokens[out.request_id] += out.new_token_ids
            decoded += len(out.new_token_ids) if prefilled else 0
        seconds += elapsed if prefilled else 0.0
    return decoded / seconds, list(tokens.values())


def eval_rows(tokenizer, eos_ids) -> dict[str, list[tuple[list[int], list[int]]]]:
    """Each demo eval set's rows as (prompt ids, completion ids): the chat prompt with the
    generation prompt; the completion, then the end-of-turn token when it ends generation."""
    turn = tokenizer.apply_chat_template(
        [{"role": "user", "content": "?"}, {"role": "assistant", "content": "\u2063"}]
    ).partition("\u2063")[2]
    end = tokenizer.encode(turn, add_special_tokens=False)[:1]
    end = end if end and end[0] in eos_ids else []
    sets = {}
    for path in sorted(EVAL_SETS.glob("*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        sets[path.stem] = [
            (
                tokenizer.encode(
                    tokenizer.apply_chat_template(r["messages"], add_generation_prompt=True),
                    add_special_tokens=False,
                ),
                tokenizer.encode(r["completion"], add_special_tokens=False) + end,
            )
            for r in rows
        ]
    return sets


def perplexities(engine, sets: dict, limit: int) -> dict[str, float]:
    """exp(mean negative log-likelihood per completion token), per set and over all."""
    totals: dict[str, tuple[float, int]] = {}
    for name, rows in sets.items():
        nll, count = 0.0, 0
        for prompt, completion in rows[:limit] if limit else rows:
            result = engine.score(prompt, completion)
            nll -= sum(max(lp, MIN_LOGPROB) for lp in result.token_logprobs)
            count += result.num_tokens
        totals[name] = (nll, count)
    totals["all"] = (sum(n for n, _ in totals.values()), sum(c for _, c in totals.values()))
    return {name: round(math.exp(nll / count), 4) for name, (nll, count) in totals.items()}


def main() -> None:
    args = bench_parser(__doc__, requests=8, max_tokens=32, rounds=2, rows=0).parse_args()
    import torch

    from inference.engine import LLMEngine

    base = model_dir(args.model)
    models = {"unquantized": base, **quantized_folders(base, list(SCHEMES))}
    weights = {name: resident_bytes(folder) for name, folder in models.items()}
    engines = {
        name: LLMEngine(
            model=str(folder), device="cpu", dtype="float32", kv_cache_bytes=KV_CACHE_BYTES
        )  # fmt: skip
        for name, folder in models.items()
    }
    reference = engines["unquantized"]
    prompts = chat_prompts(reference.tokenizer, args.requests)
    for engine in engines.values():  # warm-up
        decode_tok_s(engine, prompts[:2], 3)
    speeds: dict[str, list[float]] = {name: [] for name in engines}
    outputs: dict[str, list] = {}
    for _ in range(args.rounds):
        for name, engine in engines.items():
            tok_s, outputs[name] = decode_tok_s(engine, prompts, args.max_tokens)
            speeds[name].append(tok_s)
    sets = eval_rows(reference.tokenizer, set(reference.tokenizer.eos_token_ids))
    ppl = {name: perplexities(engine, sets, args.rows) for name, engine in engines.items()}
    for engine in engines.values():
        engine.close()

    best = {name: max(values) for name, values in speeds.items()}
    rows = {}
    for name in models:
        rows[name] = {
            "weights_bytes": weights[name],
            "weights_ratio": round(weights[name] / weights["unquantized"], 3),
            "decode_tok_s": round(best[name], 1),
            "decode_ratio": round(best[name] / best["unquantized"], 2),
            "perplexity": ppl[name],
            "perplexity_ratio": round(ppl[name]["all"] / ppl["unquantized"]["all"], 4),
            "same_greedy_tokens": sum(
                a == b for a, b in zip(outputs[name], outputs["unquantized"], strict=True)
            ),
        }
        r = rows[name]
        print(
            f"{name:12s} weights {r['weights_bytes'] / 2**20:7.1f} MiB ({r['weights_ratio']}x)"
            f"  decode {r['decode_tok_s']:6.1f} tok/s ({r['decode_ratio']}x)"
            f"  perplexity {r['perplexity']['all']} ({r['perplexity_ratio']}x)"
            f"  greedy outputs equal to unquantized: {r['same_greedy_tokens']}/{args.requests}"
        )
    figures = {
        "model": base.name,
        "schemes": SCHEMES,
        "requests": args.requests,
        "max_tokens": args.max_tokens,
        "rounds": args.rounds,
        "eval_rows": {
            name: len(rows[: args.rows] if args.rows else rows) for name, rows in sets.items()
        },  # fmt: skip
        "torch_threads": torch.get_num_threads(),
        "models": rows,
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--quantize"]:
        quantize_child(Path(sys.argv[3]), Path(sys.argv[4]), sys.argv[2])
    else:
        main()
