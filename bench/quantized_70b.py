"""Arithmetic, not a measurement: a Llama-3-70B base on one H200, in bf16, FP8 and W4A16.

    .venv/bin/python bench/quantized_70b.py [--total-gib 139] [--utilization 0.9]
        [--slots 32] [--rank 16]

From the model's config shapes alone: the weights' bytes (quantized linears at their bits
plus their scales; embeddings, lm_head and norms at 16 bits, as checkpoints leave them), the
KV cache's bytes per token in bf16 (as `EngineConfig.kv_block_bytes` counts them), one
rank-`rank` LoRA slot on all seven projections in bf16 (A: rank x in, B: out x rank), and the
KV tokens left when the engine sizes its cache as `kv_cache.device_kv_budget` does: the
share `utilization` of device memory less weights and slots. A step's activations, the
CUDA context and the decode graphs (which the engine measures at start-up) are not counted,
so the token figure is an upper bound. --total-gib defaults to the memory the H200 this
project borrows is described with.

The last line is one JSON object with the figures.
"""

import argparse
import json
from dataclasses import asdict, dataclass

GIB = 2**30


@dataclass(frozen=True)
class Shapes:
    """A Llama-family decoder's config.json figures."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = False


LLAMA_3_70B = Shapes(hidden=8192, intermediate=28672, layers=80, heads=64, kv_heads=8,
                     head_dim=128, vocab=128256)  # fmt: skip


def shapes_of(config: dict) -> Shapes:
    """The shapes of a Llama-family config.json."""
    heads = config["num_attention_heads"]
    return Shapes(
        hidden=config["hidden_size"],
        intermediate=config["intermediate_size"],
        layers=config["num_hidden_layers"],
        heads=heads,
        kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or config["hidden_size"] // heads,
        vocab=config["vocab_size"],
        tied=bool(config.get("tie_word_embeddings", False)),
    )


def projections(s: Shapes) -> list[tuple[int, int]]:
    """(in, out) of one layer's seven linears: q, k, v, o, gate, up, down."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    h, i = s.hidden, s.intermediate
    return [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]


def weights_bytes(s: Shapes, bits: int = 16, group_size: int | None = None) -> int:
    """The weights as stored: linears at `bits` with one 16-bit scale per output channel
    (group_size None) or per group of inputs; everything else at 16 bits."""
    linear = 0
    for fan_in, out in projections(s):
        scales = 0 if bits == 16 else out * (1 if group_size is None else fan_in // group_size)
        linear += fan_in * out * bits // 8 + 2 * scales
    embeddings = s.vocab * s.hidden * (1 if s.tied else 2)
    norms = s.layers * 2 * s.hidden + s.hidden
    return s.layers * linear + 2 * (embeddings + norms)


def parameters(s: Shapes) -> int:
    return weights_bytes(s) // 2


def kv_bytes_per_token(s: Shapes, itemsize: int = 2) -> int:
    return 2 * s.layers * s.kv_heads * s.head_dim * itemsize


def lora_slot_bytes(s: Shapes, rank: int = 16, itemsize: int = 2) -> int:
    return s.layers * sum(rank * (fan_in + out) for fan_in, out in projections(s)) * itemsize


@dataclass(frozen=True)
class Fit:
    scheme: str
    weights_bytes: int
    lora_slot_bytes: int
    slots: int
    kv_bytes_per_token: int
    kv_budget_bytes: int  # negative: the weights and slots alone do not fit
    kv_tokens: int


def fit(s: Shapes, scheme: str, weights: int, *, total: int, utilization: float, slots: int,
        rank: int) -> Fit:  # fmt: skip
    slot = lora_slot_bytes(s, rank)
    budget = int(total * utilization) - weights - slots * slot
    per_token = kv_bytes_per_token(s)
    return Fit(scheme, weights, slot, slots, per_token, budget, max(budget, 0) // per_token)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-gib", type=float, default=139.0)
    parser.add_argument("--utilization", type=float, default=0.9)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--rank", type=int, default=16)
    args = parser.parse_args()
    s, total = LLAMA_3_70B, int(args.total_gib * GIB)
    schemes = {
        "bf16": weights_bytes(s),
        "fp8-dynamic": weights_bytes(s, 8),
        "w4a16-g128": weights_bytes(s, 4, 128),
    }
    fits = [
        fit(s, name, w, total=total, utilization=args.utilization, slots=n, rank=args.rank)
        for name, w in schemes.items()
        for n in (0, args.slots)
    ]
    print(f"Llama-3-70B: {parameters(s):,} parameters; {args.total_gib} GiB x {args.utilization}")
    for f in fits:
        print(
            f"{f.scheme:12s} weights {f.weights_bytes / GIB:6.1f} GiB, {f.slots:3d} slots of "
            f"{f.lora_slot_bytes / 2**20:.0f} MiB: KV budget {f.kv_budget_bytes / GIB:6.1f} GiB "
            f"= {f.kv_tokens:,} tokens of {f.kv_bytes_per_token // 1024} KiB"
        )
    print(json.dumps({"model": "Llama-3-70B", "parameters": parameters(s),
                      "total_bytes": total, "utilization": args.utilization,
                      "fits": [asdict(f) for f in fits]}))  # fmt: skip


if __name__ == "__main__":
    main()
