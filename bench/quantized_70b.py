"""Arithmetic, not a measurement: a Llama-3-70B base on one H200, in bf16, FP8 and W4A16.

    .venv/bin/python bench/quantized_70b.py [--total-gib 139] [--utilization 0.9]
        [--slots 32] [--rank 16]

The capacity planner's figures (inference/engine/planning, `manage.py plan`), from the
model's config shapes alone: the weights' bytes (quantized linears at their bits plus their
scales; embeddings, lm_head and norms at 16 bits, as checkpoints leave them), the KV cache's
bytes per token in bf16, `slots` rank-`rank` LoRA slots on all seven projections with their
buffers and extras, and the KV tokens of the memory pool the engine sizes: the share
`utilization` of device memory less weights, a step's activations, the decode graphs and the
CUDA runtime, all KV cache while no adapter is in, less `slots` adapters' pages when all
slots are full. --total-gib defaults to the memory the H200 this project borrows is
described with.

The last line is one JSON object with the figures.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inference.engine.planning import PRESETS, Plan, PlanRequest, device_named, plan  # noqa: E402

GIB = 2**30
SCHEMES = ("bf16", "fp8", "w4a16")


def fit(scheme: str, slots: int, *, total: int, utilization: float, rank: int) -> Plan:
    """The planner's figures with `slots` device slots (the rest of the pool is KV cache)."""
    return plan(
        PlanRequest(
            config=PRESETS["llama-3-70b"],
            name="llama-3-70b",
            device=device_named("h200", total),
            quantization=scheme,
            rank=rank,
            max_loras=slots,
            gpu_memory_utilization=utilization,
            prompt_tokens=4000,
            output_tokens=96,
            concurrency=1,
            suggest=False,
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-gib", type=float, default=139.0)
    parser.add_argument("--utilization", type=float, default=0.9)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--rank", type=int, default=16)
    args = parser.parse_args()
    total = int(args.total_gib * GIB)
    fits = [
        fit(s, n, total=total, utilization=args.utilization, rank=args.rank)
        for s in SCHEMES
        for n in (0, args.slots)
    ]
    print(f"Llama-3-70B on {args.total_gib} GiB x {args.utilization}")
    for f in fits:
        print(
            f"{f.quantization:6s} weights {f.weights_bytes_per_gpu / GIB:6.1f} GiB, "
            f"pool {f.pool_bytes_per_gpu / GIB:6.1f} GiB: {f.kv_tokens:,} KV tokens of "
            f"{f.kv_bytes_per_token_per_gpu // 1024} KiB, {f.kv_tokens_slots_full:,} beside "
            f"{f.device_slots} full slots ({f.slots_bytes_per_gpu / GIB:4.1f} GiB)"
        )
    print(json.dumps({"model": "Llama-3-70B", "total_bytes": total,
                      "utilization": args.utilization,
                      "fits": [f.to_dict() for f in fits]}))  # fmt: skip


if __name__ == "__main__":
    main()
