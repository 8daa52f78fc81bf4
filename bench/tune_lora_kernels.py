"""Tune the LoRA kernels' tiles per shape on a GPU; write bench/results/lora_tiles_<gpu>.json.

For one Llama-3-8B-like decoder layer's target linears (qkv, o, gate_up, down) at each rank
and batch, every key of the tile table (op, path, rank, hidden, batch) gets a few candidate
tilings around its default (lora_tiles.py); one the GPU could not launch (its shared memory
or register tile, tile_limits.py) is skipped and reported. Each candidate is checked against
the torch reference, then timed with triton.testing.do_bench over every linear sharing the key; the
fastest correct one is written to the table's file, which the kernels then use on this GPU
model without code changes. Decode batches spread their tokens over up to --adapters
adapters; prefill batches are requests of --prefill-len tokens, one adapter each. The path
of each batch is the one make_lora_batch picks, as in the engine.

    python bench/tune_lora_kernels.py               # CUDA, bf16, within --budget-s
    python bench/tune_lora_kernels.py --interpret   # CPU, tiny shapes, Triton's interpreter

Keys left when the budget runs out keep their defaults. The last line printed is one JSON
object: the tuned entries, the speedup over the defaults, and the candidates refused.
"""

import os
import sys

if "--interpret" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton or the kernels are imported

import argparse
import dataclasses
import json
import math
import time
from collections.abc import Callable
from itertools import product
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpu_lora import LLAMA3_8B, TINY, layer_linears  # noqa: E402

from inference.kernels import lora_ops, lora_triton, make_lora_batch  # noqa: E402
from inference.kernels.lora_batch import LoRABatch  # noqa: E402
from inference.kernels.lora_tiles import (  # noqa: E402
    DEFAULT_TABLE,
    Tiles,
    TileTable,
    table_file,
)
from inference.kernels.tile_limits import (  # noqa: E402
    device_limits,
    launch_problem,
    limits_for_capability,
)

Linear = tuple[str, int, list[int]]  # name, input features, output slice widths

# Per op/path, the fields a candidate may change and the values each may take, relative to
# the default (a function of it) or absolute.
AXES: dict[tuple[str, str], dict[str, Callable[[int], tuple[int, ...]]]] = {
    ("shrink", "bgmv"): {
        "block_k": lambda v: (v // 2, v, v * 2),
        "split_k": lambda v: (v // 4, v, v * 4),
        "num_warps": lambda v: (2, 4, 8),
    },
    ("shrink", "sgmv"): {
        "block_m": lambda v: (32, 64, 128),
        "block_k": lambda v: (v // 2, v, v * 2),
        "split_k": lambda v: (v // 4, v, v * 4),
        "num_stages": lambda v: (2, 3, 4),
        "num_warps": lambda v: (4, 8),
    },
    ("expand", "bgmv"): {
        "block_n": lambda v: (v // 2, v, v * 2),
        "num_warps": lambda v: (2, 4, 8),
    },
    ("expand", "sgmv"): {
        "block_m": lambda v: (32, 64, 128),
        "block_n": lambda v: (v // 2, v, v * 2),
        "num_warps": lambda v: (4, 8),
    },
}


def candidates(
    op: str, path: str, default: Tiles, limit: int, problem: Callable[[Tiles], str | None]
) -> tuple[list[Tiles], list[tuple[Tiles, str]]]:
    """The default first, then the valid tilings changing fewest of its fields, up to `limit`
    that can launch; and those passed over on the way because they could not, with why."""
    axes = AXES[(op, path)]
    options = [sorted(set(values(getattr(default, name)))) for name, values in axes.items()]
    found: list[tuple[int, Tiles]] = []
    for combo in product(*options):
        try:
            tiles = dataclasses.replace(default, **dict(zip(axes, combo, strict=True)))
        except ValueError:  # out of the table's limits
            continue
        changed = sum(getattr(tiles, n) != getattr(default, n) for n in axes)
        found.append((changed, tiles))
    found.sort(key=lambda item: (item[0], dataclasses.astuple(item[1])))
    chosen: list[Tiles] = []
    refused: list[tuple[Tiles, str]] = []
    for _, tiles in found:
        if len(chosen) == limit:
            break
        why = problem(tiles)
        if why is None:
            chosen.append(tiles)
        else:
            refused.append((tiles, why))
    return chosen, refused


def token_slots(batch: int, decode: bool, adapters: int, prefill_len: int) -> torch.Tensor:
    if decode:  # one token per request, requests round robin over the adapters
        return torch.arange(batch) % min(batch, adapters)
    requests = math.ceil(batch / prefill_len)
    return (torch.arange(requests) % adapters).repeat_interleave(prefill_len)[:batch]


class Case:
    """One linear's stacked weights and inputs for one batch, with the torch reference."""

    def __init__(self, linear: Linear, weights, batch: LoRABatch, ref: LoRABatch, dtype, device):
        _, fan_in, widths = linear
        self.lora_a, self.lora_b, self.scales = weights
        rank, n, t = self.lora_a[0].shape[1], len(widths), batch.num_tokens
        self.batch = batch
        self.x = torch.randn(t, fan_in, device=device).to(dtype)
        self.y = torch.empty(n, t, rank, device=device)  # fp32, as add_lora's scratch
        self.y_in = torch.randn(n, t, rank, device=device)
        self.out = torch.zeros(t, sum(widths), device=device, dtype=dtype)
        self.y_ref = torch.empty_like(self.y)
        lora_ops.lora_shrink(self.x, self.lora_a, ref, self.y_ref)
        self.out_ref = torch.zeros_like(self.out)
        lora_ops.lora_expand(self.y_in, self.lora_b, self.scales, ref, self.out_ref, add=False)

    def run(self, op: str, tiles: Tiles) -> None:
        if op == "shrink":
            lora_triton.lora_shrink(self.x, self.lora_a, self.batch, self.y, tiles)
        else:
            lora_triton.lora_expand(
                self.y_in, self.lora_b, self.scales, self.batch, self.out, True, tiles
            )

    def error(self, op: str, tiles: Tiles) -> float:
        """Largest error of one run against the reference, relative to the reference's peak."""
        if op == "shrink":
            got, want = torch.full_like(self.y, float("nan")), self.y_ref
            lora_triton.lora_shrink(self.x, self.lora_a, self.batch, got, tiles)
        else:
            got, want = torch.zeros_like(self.out), self.out_ref
            lora_triton.lora_expand(
                self.y_in, self.lora_b, self.scales, self.batch, got, False, tiles
            )
        peak = want.float().abs().max().clamp_min(1e-6)
        return ((got.float() - want.float()).abs().max() / peak).nan_to_num(math.inf).item()


def make_weights(linear: Linear, rank: int, slots: int, dtype, device):
    _, fan_in, widths = linear

    def randn(*shape: int, fan: int) -> torch.Tensor:
        return torch.randn(shape, device=device).div(fan**0.5).to(dtype)

    lora_a = [randn(slots, rank, fan_in, fan=fan_in) for _ in widths]
    lora_b = [randn(slots, w, rank, fan=rank) for w in widths]
    return lora_a, lora_b, torch.ones(slots, device=device)


def tune_key(op, key, cases: list[Case], args, measure, report) -> Tiles | None:
    """The fastest correct candidate for one key, timed over every case sharing it."""
    _, path, rank, hidden, batch_size = key
    default = DEFAULT_TABLE.lookup(op, path, rank, hidden, batch_size)
    device, batch = cases[0].x.device, cases[0].batch
    seen, timings = set(), []
    itemsize = cases[0].x.element_size()

    def problem(tiles: Tiles) -> str | None:
        return launch_problem(op, path, tiles, rank, itemsize, args.limits)

    chosen, refused = candidates(op, path, default, args.max_candidates, problem)
    for tiles, why in refused:
        report["rejected"].append({"key": key, "tiles": str(tiles), "why": f"cannot launch: {why}"})
    for tiles in chosen:
        fitted = lora_triton.launch_tiles(op, batch, rank, hidden, device, tiles)
        if fitted in seen:  # the same launch as a candidate already timed
            continue
        seen.add(fitted)
        try:
            err = max(case.error(op, tiles) for case in cases)
            if err > args.tolerance:
                report["rejected"].append(
                    {"key": key, "tiles": str(tiles), "why": f"error {err:.2e}"}
                )
                continue
            ms = sum(measure(lambda c=case, t=tiles: c.run(op, t)) for case in cases)
        except Exception as error:  # a tiling the compiler or the GPU refuses
            report["rejected"].append({"key": key, "tiles": str(tiles), "why": repr(error)[:200]})
            continue
        report["max_rel_err"] = max(report["max_rel_err"], err)
        timings.append((ms, fitted))
    if not timings:
        return None
    fitted_default = lora_triton.launch_tiles(op, batch, rank, hidden, device, default)
    default_ms = next((ms for ms, t in timings if t == fitted_default), None)
    best_ms, best = min(timings, key=lambda item: item[0])
    row = {"key": key, "best_ms": round(best_ms, 5), "candidates": len(timings)}
    if default_ms is not None:
        row |= {"default_ms": round(default_ms, 5), "speedup": round(default_ms / best_ms, 3)}
    report["keys"].append(row)
    print(f"{' '.join(map(str, key)):36s} {len(timings):2d} candidates  best {best_ms:.4f} ms"
          f"  default {default_ms or math.nan:.4f} ms  {best}", flush=True)  # fmt: skip
    return best


def tune(linears_by_name, ranks, batches, args, device, dtype, measure) -> tuple[dict, dict]:
    """Tuned tiles per key, and the report, for every rank and batch within the budget."""
    started = time.monotonic()
    linears = [(name, f, w) for name, (f, w) in linears_by_name.items()]
    report: dict = {"keys": [], "rejected": [], "max_rel_err": 0.0, "untuned_keys": 0}
    tuned: dict = {}
    for rank in ranks:
        weights = {lin[0]: make_weights(lin, rank, args.adapters, dtype, device) for lin in linears}
        for batch_size, is_decode in batches:
            slots = token_slots(batch_size, is_decode, args.adapters, args.prefill_len)
            batch = make_lora_batch(slots, device=device, backend="triton")
            ref = make_lora_batch(slots, device=device, backend="torch")
            cases = {
                lin[0]: Case(lin, weights[lin[0]], batch, ref, dtype, device) for lin in linears
            }
            for op in ("shrink", "expand"):
                groups: dict[tuple, list[Case]] = {}  # linears sharing a key are timed together
                for name, fan_in, widths in linears:
                    hidden = fan_in if op == "shrink" else max(widths)
                    groups.setdefault((op, batch.path, rank, hidden, batch_size), []).append(
                        cases[name]
                    )
                for key, group in groups.items():
                    if time.monotonic() - started > args.budget_s:
                        report["untuned_keys"] += 1
                        continue
                    best = tune_key(op, key, group, args, measure, report)
                    if best is not None:
                        tuned[key] = best
    return tuned, report


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interpret", action="store_true", help="CPU, tiny shapes, interpreter")
    parser.add_argument(
        "--ranks", type=positive, nargs="+", help="LoRA ranks, most important first"
    )
    parser.add_argument("--decode", type=positive, nargs="+", help="decode batch sizes (tokens)")
    parser.add_argument("--prefill", type=positive, nargs="+", help="prefill batch sizes (tokens)")
    parser.add_argument("--prefill-len", type=positive, help="tokens per prefill request")
    parser.add_argument("--adapters", type=positive, default=32, help="distinct adapters at most")
    parser.add_argument("--max-candidates", type=positive, help="tilings timed per key at most")
    parser.add_argument("--budget-s", type=float, default=420, help="stop tuning after this")
    parser.add_argument("--warmup-ms", type=positive, default=5)
    parser.add_argument("--rep-ms", type=positive, default=25)
    parser.add_argument("--out", type=Path, help="table file (default: bench/results/...)")
    args = parser.parse_args()

    if args.interpret:
        device, dtype, shape, gpu = torch.device("cpu"), torch.float32, TINY, "interpret"
        ranks, decode, prefill = args.ranks or [16], args.decode or [1, 4], args.prefill or [32]
        args.prefill_len, args.max_candidates = args.prefill_len or 16, args.max_candidates or 2
        args.tolerance = 1e-4  # fp32 against fp32: only the order of the sums differs
        var = Path(os.environ.get("LORAPLEX_VAR_DIR", ROOT / "var"))
        out = args.out or var / "lora_tiles_interpret.json"
        torch.set_num_threads(1)
        args.limits = limits_for_capability(9, 0)  # check the candidates as for a Hopper

        def measure(fn: Callable[[], None]) -> float:
            start = time.perf_counter()
            fn()
            return (time.perf_counter() - start) * 1e3
    else:
        if not torch.cuda.is_available():
            sys.exit("no CUDA device: run with --interpret to check the script on CPU")
        from triton.testing import do_bench

        device, dtype, shape = torch.device("cuda"), torch.bfloat16, LLAMA3_8B
        gpu = torch.cuda.get_device_name(device)
        args.limits = device_limits(device)
        ranks, decode = args.ranks or [16, 32, 64, 8], args.decode or [1, 8, 32, 128]
        prefill = args.prefill or [512, 2048]
        args.prefill_len, args.max_candidates = args.prefill_len or 512, args.max_candidates or 8
        args.tolerance = 2e-2  # bf16 outputs: a few ulps of 2**-8
        out = args.out or table_file(gpu)

        def measure(fn: Callable[[], None]) -> float:
            return float(do_bench(fn, warmup=args.warmup_ms, rep=args.rep_ms, return_mode="median"))

    torch.manual_seed(0)
    started = time.monotonic()
    batches = [(b, True) for b in decode] + [(b, False) for b in prefill]
    tuned, report = tune(layer_linears(shape), ranks, batches, args, device, dtype, measure)
    table = TileTable(tuned)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(table.to_json(gpu), indent=1) + "\n")
    speedups = [row["speedup"] for row in report["keys"] if "speedup" in row]
    default_total = sum(row.get("default_ms", 0.0) for row in report["keys"])
    best_total = sum(row["best_ms"] for row in report["keys"] if "default_ms" in row)
    summary = {
        "gpu": gpu,
        "dtype": str(dtype).removeprefix("torch."),
        "shape": shape,
        "out": str(out),
        "seconds": round(time.monotonic() - started, 1),
        "tuned_keys": len(tuned),
        "untuned_keys": report["untuned_keys"],
        "speedup_geomean": round(math.exp(sum(map(math.log, speedups)) / len(speedups)), 3)
        if speedups
        else None,
        "speedup_total": round(default_total / best_total, 3) if best_total else None,
        "max_rel_err": float(f"{report['max_rel_err']:.2e}"),
        "rejected": report["rejected"],
        "keys": report["keys"],
        "table": table.to_json(gpu)["entries"],
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
