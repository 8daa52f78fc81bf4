"""Multi-LoRA kernels on Llama-3-8B shapes: correctness, cost against the base layer, bandwidth.

For one decoder layer's four target linears (qkv, o, gate_up, down) at rank 16, with 1-256
tokens spread over 1-64 distinct adapters, it times add_lora (shrink + expand, the call the
engine makes) on each kernel path, compares it with the base matmuls of the same layer, and
checks the Triton result against the torch reference. Needs only torch and triton.

    python bench/gpu_lora.py              # CUDA: bf16, CUDA events, warmup
    python bench/gpu_lora.py --interpret  # CPU: tiny shapes under TRITON_INTERPRET

The last line printed is one JSON object with every figure.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LLAMA3_8B = {"hidden": 4096, "kv": 1024, "ffn": 14336}
TINY = {"hidden": 64, "kv": 16, "ffn": 96}


def layer_linears(shape: dict) -> dict[str, tuple[int, list[int]]]:
    """Target linear -> (input features, output slice widths), merged as the engine merges them."""
    h, kv, ffn = shape["hidden"], shape["kv"], shape["ffn"]
    return {"qkv": (h, [h, kv, kv]), "o": (h, [h]), "gate_up": (h, [ffn, ffn]), "down": (ffn, [h])}


def timer(device: torch.device, warmup: int, iters: int):
    """Mean milliseconds of fn(): CUDA events after warmup on a GPU, the wall clock elsewhere."""

    def measure(fn) -> float:
        for _ in range(warmup):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / iters
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t0) * 1e3 / iters

    return measure


def graphed(device: torch.device, measure):
    """Milliseconds of fn() replayed from a CUDA graph: kernel time without Python launch cost."""

    def measure_graph(fn) -> float | None:
        if device.type != "cuda":
            return None
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                fn()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
            return measure(graph.replay)
        except Exception as error:  # report, keep benchmarking the eager path
            print(f"CUDA graph capture failed: {error!r}", file=sys.stderr)
            return None

    return measure_graph


class Layer:
    """One decoder layer's target linears: stacked LoRA A/B over every slot, and base weights."""

    def __init__(self, linears, num_slots, rank, dtype, device):
        self.linears, self.rank, self.dtype, self.device = linears, rank, dtype, device
        self.weights = {}
        for name, (fan_in, widths) in linears.items():
            lora_a = [self.randn(num_slots, rank, fan_in, fan_in=fan_in) for _ in widths]
            lora_b = [self.randn(num_slots, w, rank, fan_in=rank) for w in widths]
            base = self.randn(sum(widths), fan_in, fan_in=fan_in)
            self.weights[name] = (lora_a, lora_b, base)
        self.scales = torch.ones(num_slots, device=device)

    def randn(self, *shape: int, fan_in: int) -> torch.Tensor:
        return torch.randn(shape, device=self.device).div(fan_in**0.5).to(self.dtype)

    def bytes_moved(self, n_tok: int, distinct: int) -> int:
        """What a perfect kernel moves: the distinct adapters' A and B once, the activations
        in, fp32 y out and back, and the output read and written."""
        elt, total = torch.tensor([], dtype=self.dtype).element_size(), 0
        for fan_in, widths in self.linears.values():
            n, width = len(widths), sum(widths)
            total += distinct * self.rank * (n * fan_in + width) * elt
            total += n_tok * fan_in * elt + 2 * n * n_tok * self.rank * 4 + 2 * n_tok * width * elt
        return total


def bench_case(layer: Layer, n_tok: int, distinct: int, timers) -> list[dict]:
    """Every kernel path for n_tok tokens spread round-robin over `distinct` adapters."""
    # Imported only once main() has set TRITON_INTERPRET for --interpret.
    from inference.kernels import add_lora, make_lora_batch

    measure, measure_base, measure_graph = timers
    dev, dtype = layer.device, layer.dtype
    token_slots = (torch.arange(n_tok) % distinct).to(dev)
    xs = {n: torch.randn(n_tok, f, device=dev).to(dtype) for n, (f, _) in layer.linears.items()}
    outs = {
        n: torch.zeros(n_tok, sum(w), device=dev, dtype=dtype)
        for n, (_, w) in layer.linears.items()
    }
    buffer = torch.empty(3, n_tok, layer.rank, device=dev)

    def base_layer():
        for name, (_, _, w) in layer.weights.items():
            torch.matmul(xs[name], w.T, out=outs[name])

    def lora_layer(batch):
        for name, (lora_a, lora_b, _) in layer.weights.items():
            add_lora(outs[name], xs[name], lora_a, lora_b, layer.scales, batch, buffer)

    base_ms, base_graph_ms = measure_base(base_layer), measure_graph(base_layer)
    reference = make_lora_batch(token_slots, backend="torch")
    rows = []
    for path in ("auto", "sgmv", "bgmv"):
        batch = make_lora_batch(
            token_slots, backend="triton", path=None if path == "auto" else path
        )
        lora_ms = measure(lambda batch=batch: lora_layer(batch))
        lora_graph_ms = measure_graph(lambda batch=batch: lora_layer(batch))
        err = 0.0
        for name, (lora_a, lora_b, _) in layer.weights.items():
            got, want = torch.zeros_like(outs[name]), torch.zeros_like(outs[name])
            add_lora(got, xs[name], lora_a, lora_b, layer.scales, batch)
            add_lora(want, xs[name], lora_a, lora_b, layer.scales, reference)
            scale = want.float().abs().max().clamp_min(1e-6)
            err = max(err, ((got.float() - want.float()).abs().max() / scale).item())
        graph_ratio = (
            None
            if lora_graph_ms is None or base_graph_ms is None
            else lora_graph_ms / base_graph_ms
        )
        row = {
            "tokens": n_tok,
            "adapters": distinct,
            "path": path if path != "auto" else f"auto:{batch.path}",
            "lora_ms": round(lora_ms, 4),
            "base_ms": round(base_ms, 4),
            "lora_over_base": round(lora_ms / base_ms, 3),
            "lora_graph_ms": None if lora_graph_ms is None else round(lora_graph_ms, 4),
            "base_graph_ms": None if base_graph_ms is None else round(base_graph_ms, 4),
            "lora_graph_over_base_graph": None if graph_ratio is None else round(graph_ratio, 3),
            # From the graph replay when there is one: launch cost is not bandwidth.
            "gb_per_s": float(
                f"{layer.bytes_moved(n_tok, distinct) / (lora_graph_ms or lora_ms) / 1e6:.3g}"
            ),
            "max_rel_err": float(f"{err:.2e}"),
        }
        rows.append(row)
        graph = (
            ""
            if graph_ratio is None
            else f"  graphs: lora {lora_graph_ms:.4f} base {base_graph_ms:.4f} ms "
            f"ratio {graph_ratio:.3f}"
        )
        print(
            f"T={n_tok:4d} adapters={distinct:3d} {row['path']:10s} lora {lora_ms:8.3f} ms"
            f"  base {base_ms:8.3f} ms  lora/base {row['lora_over_base']:8.3f}"
            f"  {row['gb_per_s']:8.3g} GB/s  rel err {err:.1e}{graph}",
            flush=True,
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--interpret", action="store_true", help="CPU, tiny shapes, Triton interpreter"
    )
    parser.add_argument("--tokens", type=int, nargs="+", help="batch sizes in tokens")
    parser.add_argument("--adapters", type=int, nargs="+", help="distinct adapters per batch")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--warmup", type=int)
    parser.add_argument("--iters", type=int)
    args = parser.parse_args()

    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # before lora_triton (and its @triton.jit) is imported
        device, dtype, shape = torch.device("cpu"), torch.float32, TINY  # interpreter bf16 is wrong
        tokens, adapters = args.tokens or [1, 8], args.adapters or [1, 4]
        warmup, iters = args.warmup or 0, args.iters or 1
        torch.set_num_threads(1)  # a shared small CPU: threads waiting on each other add noise
    else:
        if not torch.cuda.is_available():
            sys.exit("no CUDA device: run with --interpret to check the kernels on CPU")
        device, dtype, shape = torch.device("cuda"), torch.bfloat16, LLAMA3_8B
        tokens, adapters = args.tokens or [1, 4, 16, 64, 256], args.adapters or [1, 8, 64]
        warmup, iters = args.warmup or 10, args.iters or 50

    torch.manual_seed(0)
    layer = Layer(layer_linears(shape), max(adapters), args.rank, dtype, device)
    measure = timer(device, warmup, iters)
    measure_base = timer(device, max(warmup, 2), max(iters, 5))  # cheap; more runs, less noise
    timers = (measure, measure_base, graphed(device, measure))
    results, seen = [], set()
    for n_tok in tokens:
        for n_req in adapters:
            distinct = min(n_req, n_tok)
            if (n_tok, distinct) not in seen:
                seen.add((n_tok, distinct))
                results += bench_case(layer, n_tok, distinct, timers)

    tolerance = 2e-2 if dtype == torch.bfloat16 else 1e-4
    auto = [r for r in results if r["path"].startswith("auto")]
    summary = {
        "device": torch.cuda.get_device_name()
        if device.type == "cuda"
        else "cpu (Triton interpreter)",
        "dtype": str(dtype).removeprefix("torch."),
        "shape": shape,
        "rank": args.rank,
        "correct": all(r["max_rel_err"] <= tolerance for r in results),
        "max_rel_err": max(r["max_rel_err"] for r in results),
        "auto_lora_over_base_max": max(r["lora_over_base"] for r in auto),
        "auto_lora_over_base_median": sorted(r["lora_over_base"] for r in auto)[len(auto) // 2],
        "auto_graph_ratio_max": max(
            (r["lora_graph_over_base_graph"] for r in auto if r["lora_graph_over_base_graph"]),
            default=None,
        ),
        "results": results,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
