"""The GPU suite: correctness and speed of the whole GPU path on one device, in one command.

    python bench/gpu_suite.py               # CUDA, bf16, Llama-3-8B shapes; about 8 minutes
    python bench/gpu_suite.py --interpret   # CPU, tiny shapes, Triton interpreter, fp32

Sections (each guarded: a failure is recorded in its entry and the rest still run, under
one time budget with a cap per section):
  environment          versions and device
  kernels              Triton paged attention and LoRA kernels against the torch reference
  correctness          64 greedy tokens of a random Llama-shaped model against transformers,
                       the first divergence explained by a bf16 near-tie, max logit error
  copy_bandwidth       a device-to-device copy: the bandwidth yardstick
  serving_model        random Llama-3-8B weights made on the device and saved; 32 PEFT adapters
  decode_throughput    the engine's decode tokens/s at batch 1, 32, 128, with CUDA graphs and
                       without (enforce_eager)
  memory_bandwidth     bytes of weights and KV read per decode step / step time, as a share
                       of the copy's rate
  ttft                 a 1,000-token prompt's time to first token, cold and prefix-cached
  transformers_generate  transformers' `generate` at the same shapes
  lora_batch           32 distinct rank-16 adapters in one batch of 32 vs the base model
  lora_swap            an adapter's swap-in against a plain pinned copy of its bytes

Needs only torch, triton, transformers, peft and safetensors: no Django, no network. The last
line printed is one JSON object; progress goes to stderr.
"""

import argparse
import gc
import json
import os
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@dataclass(frozen=True)
class Profile:
    """Every size the suite uses: the GPU's, or --interpret's tiny ones."""

    device: str
    dtype: str
    budget_s: float
    attention_backend: str
    correctness_shape: tuple[int, ...]  # hidden, layers, heads, kv heads, ffn, vocab, positions
    correctness_tokens: int
    correctness_prompt: int
    big_shape: tuple[int, ...] | None  # None: Llama-3-8B
    init_std: float
    batches: tuple[int, ...]
    prompt_len: int
    warm_steps: int
    decode_steps: int
    hf_batches: tuple[int, ...]
    hf_steps: int
    adapters: int
    swap_reps: int
    ttft_prompt: int
    ttft_repeats: int
    copy_bytes: int
    max_model_len: int
    kv_cache_bytes: int
    block_size: int
    caps: dict[str, float] = field(default_factory=dict)


GPU = Profile(
    device="cuda", dtype="bfloat16", budget_s=450, attention_backend="auto",
    correctness_shape=(1024, 4, 8, 2, 3584, 4096, 2048), correctness_tokens=64,
    correctness_prompt=32, big_shape=None, init_std=0.05, batches=(1, 32, 128), prompt_len=128,
    warm_steps=3, decode_steps=24, hf_batches=(1, 32, 128), hf_steps=16, adapters=32,
    swap_reps=200, ttft_prompt=1000, ttft_repeats=3, copy_bytes=1 << 30, max_model_len=2048,
    kv_cache_bytes=24 << 30, block_size=16,
    caps={"environment": 10, "kernels": 60, "correctness": 60, "copy_bandwidth": 15,
          "serving_model": 110, "decode_throughput": 110, "memory_bandwidth": 5, "ttft": 30,
          "transformers_generate": 60, "lora_batch": 70, "lora_swap": 20},
)  # fmt: skip
INTERPRET = Profile(
    device="cpu", dtype="float32", budget_s=120, attention_backend="triton",
    correctness_shape=(64, 2, 4, 2, 128, 512, 256), correctness_tokens=8, correctness_prompt=6,
    big_shape=(64, 2, 4, 2, 128, 512, 256), init_std=0.1, batches=(1, 2, 4), prompt_len=5,
    warm_steps=1, decode_steps=2, hf_batches=(1, 4), hf_steps=2, adapters=4, swap_reps=10,
    ttft_prompt=40, ttft_repeats=1, copy_bytes=1 << 20, max_model_len=256, kv_cache_bytes=1 << 22,
    block_size=16,
    caps={"environment": 10, "kernels": 30, "correctness": 30, "copy_bandwidth": 10,
          "serving_model": 30, "decode_throughput": 30, "memory_bandwidth": 5, "ttft": 20,
          "transformers_generate": 20, "lora_batch": 30, "lora_swap": 10},
)  # fmt: skip
SECTIONS = tuple(GPU.caps)


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"the budget must be more than 0 seconds, got {text}")
    return value


def existing_folder(text: str) -> Path:
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is not an existing folder")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--interpret", action="store_true", help="CPU, tiny shapes, Triton interpreter"
    )
    parser.add_argument("--budget", type=positive_seconds, help="seconds for the whole run")
    parser.add_argument(
        "--workdir", type=existing_folder, help="where models are written (default: a temp dir)"
    )
    args = parser.parse_args()
    profile = INTERPRET if args.interpret else GPU
    if not args.interpret:
        import torch

        if not torch.cuda.is_available():
            sys.exit("gpu_suite: no CUDA device here; run with --interpret to check it on CPU")
    else:
        # Before any module defining @triton.jit kernels is imported; the LoRA ops take the
        # Triton path too, so the same kernels run as on the GPU.
        os.environ["TRITON_INTERPRET"] = "1"
        os.environ["LORAPLEX_LORA_BACKEND"] = "triton"
    from gpu_suite_budget import Budget
    from gpu_suite_run import Suite

    budget = Budget(args.budget or profile.budget_s)
    with tempfile.TemporaryDirectory(prefix="gpu-suite-", dir=args.workdir) as workdir:
        suite = Suite(profile, Path(workdir), budget)
        for name in SECTIONS:
            budget.run(name, profile.caps[name], getattr(suite, name))
        suite.close()
        gc.collect()
    report = {
        "suite": "loraplex-gpu",
        "mode": "interpret" if args.interpret else "cuda",
        "profile": {k: v for k, v in asdict(profile).items() if k != "caps"},
        "budget_s": budget.total_s,
        "elapsed_s": round(budget.elapsed(), 1),
        "sections": budget.sections,
        "goals": suite.goals(),
    }
    print(json.dumps(report, default=str))


if __name__ == "__main__":
    main()
