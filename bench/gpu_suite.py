"""The GPU suite: correctness and speed of the whole GPU path on one device, in one command
that cannot overrun its budget (6 minutes on an H200, imports and model creation included).

    python bench/gpu_suite.py                     # CUDA, bf16, Llama-3-8B shapes
    python bench/gpu_suite.py --plan              # each section's cap, in order; runs nothing
    python bench/gpu_suite.py --out run.json      # the report also written there, as it grows
    python bench/gpu_suite.py --sections lora_batch,lora_swap   # some sections (and their inputs)
    python bench/gpu_suite.py --interpret         # CPU, tiny shapes, Triton interpreter, fp32

Every section runs in a process of its own, forked from this one after the heavy imports,
and is killed with its process group at the end of its time (its cap, and what earlier
sections left unused): SIGTERM, which dumps its Python stacks, a moment before, SIGKILL at
it. The order puts what proves most first:
  environment            versions, device, a device-to-device copy (the bandwidth yardstick)
  correctness            64 greedy tokens of a random Llama-shaped model against transformers
                         (the first divergence explained by a bf16 near-tie), max logit error
  kernels                Triton paged attention and LoRA kernels against the torch reference
  compile_count          Triton compilations while serving, after the engine's warm-up
  nccl                   a lost tensor-parallel rank under NCCL ends in the engine's error
                         (two GPUs, else it says so; gloo under --interpret)
  serving_model          random Llama-3-8B weights made on the device and saved (safetensors)
                         with 32 PEFT adapters, for the sections below to load
  lora_batch             32 distinct rank-16 adapters in one batch of 32 vs the base model
  lora_swap              an adapter's swap-in against a plain pinned copy of its bytes
  decode_graphs, decode_eager   decode tokens/s at batch 1, 32, 128, and the bandwidth share
  ttft                   a 1,000-token prompt's time to first token, cold and prefix-cached
  transformers_generate  transformers' `generate` at the same shapes
  quant_decode           decode over the served model quantized to FP8 and W4A16, and bf16
Only when named (--sections):
  pool_trace             the memory pool against fixed splits of one budget, through the
                         trace of bench/memory_pool_trace.py at the served model's shapes
A section whose module is not in bench/ (yet) is skipped as not available.

Needs only torch, triton, transformers, peft and safetensors: no Django, no network. The last
line printed is one JSON object, even when a section hangs or crashes or the run is
interrupted (SIGINT, SIGTERM, SIGHUP), naming every skipped section and why; progress and the
sections' own output go to stderr.
"""

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from gpu_suite_plan import (
    INTERPRET_TOTAL_S,
    ON_REQUEST,
    SECTIONS,
    TOTAL_S,
    Section,
    plan,
    plan_table,
)
from gpu_suite_profile import GPU, INTERPRET

STARTED = time.monotonic()  # the budget counts the heavy imports too
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Imported once here; every forked section has them already.
PRELOAD = ("torch", "triton", "safetensors", "transformers",
           "transformers.models.llama.modeling_llama", "peft", "inference.engine",
           "inference.kernels.paged_attention", "gpu_suite_sections")  # fmt: skip


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


def chosen(
    names: str | None, sections: tuple[Section, ...], on_request: tuple[Section, ...] = ON_REQUEST
) -> tuple[Section, ...]:
    """The named sections and those they need, in plan order (all of `sections` for None;
    one of `on_request` runs only when named)."""
    if names is None:
        return sections
    sections = (*sections, *on_request)
    by_name = {s.name: s for s in sections}
    wanted = {n.strip() for n in names.split(",") if n.strip()}
    unknown = sorted(wanted - set(by_name))
    if unknown:
        raise SystemExit(f"gpu_suite: no section {', '.join(unknown)}; see --plan")
    wanted |= {need for n in wanted for need in by_name[n].needs}
    return tuple(s for s in sections if s.name in wanted)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--interpret", action="store_true", help="CPU, tiny shapes, Triton interpreter"
    )
    parser.add_argument("--plan", action="store_true", help="print the plan and run nothing")
    parser.add_argument("--budget", type=positive_seconds, help="seconds for the whole run")
    parser.add_argument("--sections", help="comma-separated sections to run (default: all)")
    parser.add_argument("--out", type=Path, help="also write the report to this file")
    parser.add_argument(
        "--workdir", type=existing_folder, help="where models are written (default: a temp dir)"
    )
    parser.add_argument(
        "--isolation", choices=("fork", "exec"), default="fork",
        help="fork sections from this process (default) or start each as a new interpreter",
    )  # fmt: skip
    return parser.parse_args(argv)


def preload(modules: tuple[str, ...], run_extra: dict) -> None:
    began = time.monotonic()
    errors = {}
    for module in modules:
        try:
            __import__(module)
        except Exception as error:  # the sections that need it will say so too
            errors[module] = f"{type(error).__name__}: {error}"
    run_extra["preload_s"] = round(time.monotonic() - began, 2)
    if errors:
        run_extra["preload_errors"] = errors


def main(
    argv: list[str] | None = None,
    sections: tuple[Section, ...] = SECTIONS,
    preloaded: tuple[str, ...] = PRELOAD,
) -> None:
    args = parse(argv)
    sections = chosen(args.sections, sections)
    if args.plan:
        planned = plan(args.interpret, sections)
        print(plan_table(planned))
        print(json.dumps(planned))
        return
    if args.interpret:
        # Before any module defining @triton.jit kernels is imported; the LoRA ops take the
        # Triton path too, so the same kernels run as on the GPU.
        os.environ["TRITON_INTERPRET"] = "1"
        os.environ["LORAPLEX_LORA_BACKEND"] = "triton"
    else:
        os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # keeps forking safe
    from gpu_suite_process import fork_is_safe
    from gpu_suite_runner import Run, log

    def prepare(run: Run) -> None:
        """The heavy imports, once, for every forked section; SIGINT, SIGTERM and the
        budget's alarm already reach the run here."""
        if args.isolation == "fork":
            preload(preloaded, run.extra)
        run.fork = args.isolation == "fork" and fork_is_safe()
        if args.isolation == "fork" and not run.fork:
            run.extra["fork_refused"] = "CUDA was initialised in the suite's process"
            log("forking is unsafe here (CUDA initialised in this process): sections exec")

    budget = args.budget or (INTERPRET_TOTAL_S if args.interpret else TOTAL_S)
    profile = INTERPRET if args.interpret else GPU
    # a section left behind (stuck in the kernel) may still hold files there: not an error
    folder = tempfile.TemporaryDirectory(prefix="gpu-suite-", dir=args.workdir,
                                         ignore_cleanup_errors=True)  # fmt: skip
    with folder as workdir:
        run = Run(sections=sections, profile=profile, workdir=Path(workdir), budget_s=budget,
                  started=STARTED, out=args.out)  # fmt: skip
        run.fork = args.isolation == "fork"
        try:
            run.run(prepare)
        finally:  # the report is the last line, whatever happened above
            try:
                run.save(args.out)
            except OSError as error:
                log(f"could not write {args.out}: {error}")
            print(json.dumps(run.report(), default=str), flush=True)
    if run.signal is not None:
        sys.exit(128 + signal.Signals[run.signal].value)
    if run.failure is not None:
        sys.exit(f"gpu_suite: the suite itself failed: {run.failure}")
    if run.stop_reason == "no CUDA device here":
        sys.exit("gpu_suite: no CUDA device here; run with --interpret to check it on CPU")


if __name__ == "__main__":
    main()
