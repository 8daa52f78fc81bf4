"""Every kernel launch an engine of given shapes can make, made through the engine's own
wrappers on `meta` tensors (shapes and strides without memory), so each launch gets the
specialisation a real one would. Under `intercepted` (launches.py) the launches are
recorded or compiled instead of run; without it they would fail, as meta tensors have no
data.

What varies from step to step is covered by its extremes and by every value that changes
a choice: the tokens of a step (each region of the tile table's nearest-batch lookup),
the longest LoRA segment (the SGMV token block it caps), decode batch sizes and table
widths (whether decode splits the context), and the CUDA graphs' batch sizes.
"""

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import torch

from inference.kernels.lora_batch import LoRABatch
from inference.kernels.lora_tiles import TileTable

from .shapes import EngineShapes

META = torch.device("meta")


def launch_all(shapes: EngineShapes, table: TileTable, done: set[object] | None = None) -> None:
    """Make every launch an engine of these shapes can make; `table` is the tile table the
    engine's device uses (lora_tiles.table_for_gpu). `done` (shared between calls) skips
    the launches an earlier call with the same sizes made."""
    done = set() if done is None else done
    s = shapes
    attention = ("attention", s.dtype, s.num_heads, s.num_kv_heads, s.head_dim, s.windows,
                 s.softcap, s.max_model_len, s.max_num_seqs, s.max_num_batched_tokens,
                 s.block_size, s.graph_sizes)  # fmt: skip
    if attention not in done:
        done.add(attention)
        attention_launches(s)
    if s.lora_rank:
        lora_launches(s, table, done)
    if s.quant_schemes:
        quant_launches(s, done)


def attention_launches(s: EngineShapes) -> None:
    from inference.kernels import paged_attention as P

    q_width = (s.num_heads + s.num_kv_heads) * s.head_dim  # q is a view of q and k (decoder.py)
    cache = torch.empty(2, 2, s.block_size, s.num_kv_heads, s.head_dim, dtype=s.dtype, device=META)
    k_cache, v_cache = cache[0], cache[1]
    scale = s.head_dim**-0.5

    def queries(n: int) -> torch.Tensor:
        full = torch.empty(n, q_width, dtype=s.dtype, device=META)
        return full[:, : s.num_heads * s.head_dim].view(n, s.num_heads, s.head_dim)

    def ints(*shape: int) -> torch.Tensor:
        return torch.empty(*shape, dtype=torch.int32, device=META)

    for window in s.windows:
        tokens = s.max_num_batched_tokens
        for seqs, width in ((1, 1), (s.max_num_seqs, s.max_blocks)):
            P.paged_extend(queries(tokens), k_cache, v_cache, ints(seqs, width), ints(seqs + 1),
                           ints(seqs), scale, max_query_len=tokens, window=window,
                           softcap=s.softcap)  # fmt: skip
        eager = [(n, w) for n in (1, s.max_num_seqs) for w in (1, s.max_blocks)]
        graphs = [(n, s.max_blocks) for n in s.graph_sizes]
        for seqs, width in eager + graphs:
            P.paged_decode(queries(seqs), k_cache, v_cache, ints(seqs, width), ints(seqs), scale,
                           window=window, softcap=s.softcap)  # fmt: skip


def token_counts(table: TileTable, largest: int) -> list[int]:
    """Step sizes that between them meet every tile choice the table makes for steps of 1..
    `largest` tokens: the table's batch sizes, the sizes either side of each midpoint (in
    log2) between neighbours, where the nearest entry changes, and the powers of two (the
    SGMV token block follows them)."""
    batches = sorted({key[4] for key in table.entries})
    counts = {1, largest} | {2**i for i in range(largest.bit_length())}
    for b in batches:
        counts |= {b - 1, b, b + 1}
    for low, high in zip(batches, batches[1:], strict=False):
        middle = math.sqrt(low * high)
        counts |= {math.floor(middle), math.floor(middle) + 1, math.ceil(middle)}
    return sorted(n for n in counts if 1 <= n <= largest)


def _lora_targets(s: EngineShapes) -> list[tuple[int, list[int]]]:
    """(input features, output slice widths) of each LoRA target linear of a layer."""
    q, kv = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    return [(s.hidden, [q, kv, kv]), (q, [s.hidden]), (s.hidden, [s.intermediate] * 2),
            (s.intermediate, [s.hidden])]  # fmt: skip


def _batch(num_tokens: int, max_seg_len: int, path: str, deterministic: bool = False) -> LoRABatch:
    """A meta batch: what the launches read of it are its sizes and its tensors' dtypes."""
    longs = torch.empty(num_tokens, dtype=torch.int64, device=META)
    segment = torch.empty(1, dtype=torch.int64, device=META)
    return LoRABatch(
        token_slots=longs, sorted_token_ids=longs, seg_starts=segment, seg_lens=segment,
        seg_slots=segment, padded_rows=longs, segments=((0, 0, max_seg_len),),
        num_tokens=num_tokens, max_seg_len=max_seg_len, max_slot=0, path=path,
        backend="triton", deterministic=deterministic,
    )  # fmt: skip


def lora_launches(s: EngineShapes, table: TileTable, done: set[object]) -> None:
    """The LoRA launches of each target linear: for every step size, a BGMV batch and SGMV
    batches whose longest segment takes each token block, launched once per distinct
    choice of tiles (what a launch's variant depends on besides the fixed sizes)."""
    from inference.kernels import lora_triton as L

    rank, itemsize = s.lora_rank, s.dtype.itemsize
    # LoRASlots' layout: every factor a view of one [max_loras, slot] tensor, fp32 scratch
    buffer = torch.empty(3, s.lora_tokens, rank, dtype=torch.float32, device=META)
    scales = torch.empty(s.max_loras, dtype=torch.float32, device=META)
    for fan_in, widths in _lora_targets(s):
        sizes = ("lora", s.dtype, rank, fan_in, tuple(widths), s.lora_tokens, s.max_loras,
                 s.deterministic)  # fmt: skip
        if sizes in done:
            continue
        done.add(sizes)
        row = torch.empty(s.max_loras, rank * (fan_in + sum(widths)) * 2, dtype=s.dtype,
                          device=META)  # fmt: skip
        lora_a = [row[:, : rank * fan_in].unflatten(1, (rank, fan_in)) for _ in widths]
        lora_b = [row[:, : w * rank].unflatten(1, (w, rank)) for w in widths]
        for tokens in token_counts(table, s.lora_tokens):
            x = torch.empty(tokens, fan_in, dtype=s.dtype, device=META)
            out = torch.empty(tokens, sum(widths), dtype=s.dtype, device=META)
            y = buffer[: len(widths), :tokens]
            # SGMV needs segments of 4 or more tokens on average; the longest caps its block
            longest = [2**i for i in range(2, tokens.bit_length())] + [tokens]
            batches = [_batch(tokens, tokens, "bgmv", s.deterministic)]
            batches += [_batch(tokens, n, "sgmv", s.deterministic) for n in longest if n >= 4]
            for batch in batches:
                shrink = table.lookup("shrink", batch.path, rank, fan_in, tokens)
                expand = table.lookup("expand", batch.path, rank, max(widths), tokens)
                fitted = (
                    sizes,
                    batch.path,
                    L.launch_tiles("shrink", batch, rank, fan_in, META, shrink, itemsize),
                    L.launch_tiles("expand", batch, rank, max(widths), META, expand, itemsize),
                )
                if fitted in done:
                    continue
                done.add(fitted)
                L.lora_shrink(x, lora_a, batch, y, tiles=shrink)
                L.lora_expand(y, lora_b, scales, batch, out, True, tiles=expand)


def tile_table_launches(table: TileTable, dtype: torch.dtype) -> None:
    """One launch at each entry of `table`, with its tiles: a tuned or default entry that
    no deployment shape reaches still has to compile."""
    from inference.kernels import lora_triton as L

    for (op, path, rank, hidden, tokens), tiles in table.entries.items():
        y = torch.empty(1, tokens, rank, dtype=torch.float32, device=META)
        batch = _batch(tokens, tokens, path)
        if op == "shrink":
            x = torch.empty(tokens, hidden, dtype=dtype, device=META)
            lora_a = torch.empty(4, rank, hidden, dtype=dtype, device=META)
            L.lora_shrink(x, [lora_a], batch, y, tiles=tiles)
        else:
            out = torch.empty(tokens, hidden, dtype=dtype, device=META)
            lora_b = torch.empty(4, hidden, rank, dtype=dtype, device=META)
            scales = torch.empty(4, dtype=torch.float32, device=META)
            L.lora_expand(y, [lora_b], scales, batch, out, True, tiles=tiles)


# The quantized-base schemes `quant_launches` knows, by their engine names
# (QuantizationScheme.name): fp8-dynamic, fp8-static, fp8-weight-only (each with -tensor for
# one weight scale), and packed integers "w<4|8>a16-<g32|g64|g128|channel>[-asym]
# [-actorder]"; AWQ's and GPTQ's ("awq-w4-g128", "gptq-w4-g128[-actorder]") run the same
# kernel once repacked, with zero points.
DEFAULT_QUANT_SCHEMES = ("fp8-dynamic", "w4a16-g128", "w8a16-channel")
FP8_TENSOR_CORES = 89  # the first arch with e4m3 dots; before it FP8 layers run weight-only
_GROUPS = {"g32": 32, "g64": 64, "g128": 128, "channel": None}


@dataclass(frozen=True)
class QuantLayer:
    """What of a scheme decides its kernels' variants."""

    fp8: bool
    activations: str = "dynamic"  # FP8: dynamic, static or weight-only
    per_tensor: bool = False  # FP8: one weight scale
    bits: int = 8
    group_size: int | None = None  # None: per channel
    asym: bool = False
    actorder: bool = False


def quant_layer(name: str) -> QuantLayer:
    """The kernel-relevant parts of a scheme named as the engine names it."""
    parts = name.split("-")
    if parts[0] == "fp8":
        acts = "-".join(p for p in parts[1:] if p != "tensor")
        if acts not in ("dynamic", "static", "weight-only"):
            raise ValueError(f"unknown FP8 scheme {name!r} (e.g. {DEFAULT_QUANT_SCHEMES})")
        return QuantLayer(fp8=True, activations=acts, per_tensor="tensor" in parts)
    if parts[0] in ("awq", "gptq") and len(parts) > 1:
        parts = [f"{parts[1]}a16", *parts[2:], "asym"]
    bits = {"w4a16": 4, "w8a16": 8}.get(parts[0])
    if bits is None or len(parts) < 2 or parts[1] not in _GROUPS:
        raise ValueError(f"unknown quantization scheme {name!r} (e.g. {DEFAULT_QUANT_SCHEMES})")
    if not set(parts[2:]) <= {"asym", "actorder"}:
        raise ValueError(f"unknown quantization scheme {name!r} (e.g. {DEFAULT_QUANT_SCHEMES})")
    return QuantLayer(fp8=False, bits=bits, group_size=_GROUPS[parts[1]], asym="asym" in parts,
                      actorder="actorder" in parts)  # fmt: skip


def check_quant_schemes(names: tuple[str, ...]) -> tuple[str, ...]:
    """`names`, after refusing one `quant_launches` does not know."""
    for name in names:
        quant_layer(name)
    return names


def _target_arch() -> int:
    """The arch Triton compiles for now (compile_target's, or the GPU's); 90 when there is
    no driver (recording launches under the interpreter)."""
    from triton.runtime.driver import driver

    try:
        return int(driver.active.get_current_target().arch)
    except RuntimeError:
        return 90


def quant_row_counts(s: EngineShapes) -> list[int]:
    """Token counts meeting every tile bucket of the quantized GEMMs (quant_triton.py):
    the kernels do not specialise on the count, so one per bucket would do; both ends of
    each, and the CUDA graphs' batch sizes, keep the launches as the engine makes them."""
    from inference.kernels import quant_triton as Q

    largest = s.lora_tokens
    tables = (Q.INT_TILES, Q.FP8_TILES, Q.FP32_TILES)
    bounds = sorted({b for table in tables for b, _ in table if b})
    counts = {1, largest, *s.graph_sizes, *bounds} | {b + 1 for b in bounds}
    return sorted(n for n in counts if 1 <= n <= largest)


def quant_launches(s: EngineShapes, done: set[object]) -> None:
    """The quantized-weight GEMMs of each linear of a layer, for each scheme of
    `s.quant_schemes`, at every token bucket, made as the loaded layers make them
    (quantized_linear.py): q, k, v and gate, up stacked into one GEMM unless each part
    keeps its own activation order or static input scale. A group size that does not
    divide a linear's inputs is skipped: the engine refuses that model."""
    from inference.kernels import quant_triton as Q

    arch = _target_arch()
    for scheme in s.quant_schemes:
        layer = quant_layer(scheme)
        scale_dtype = _scale_dtype(scheme, s)
        for (fan_in, widths), row_parallel in zip(_lora_targets(s), (False, True, False, True),
                                                  strict=True):  # fmt: skip
            for n in _piece_widths(layer, widths):
                # a row-parallel dynamic FP8 layer under tensor parallelism quantizes its
                # activations by the whole row's amax itself, then runs weight-only
                dynamic = layer.fp8 and layer.activations == "dynamic"
                weight_only = dynamic and row_parallel and s.tensor_parallel > 1
                sizes = ("quant", layer, s.dtype, scale_dtype, fan_in, n, weight_only,
                         arch >= FP8_TENSOR_CORES)  # fmt: skip
                if sizes in done:
                    continue
                done.add(sizes)
                # an activation order that is just consecutive groups is dropped at load
                for order in {layer.actorder, False}:
                    piece = dataclasses.replace(layer, actorder=order)
                    launch = _quant_launch(piece, fan_in, n, s.dtype, scale_dtype, arch,
                                           weight_only)  # fmt: skip
                    if launch is None:
                        continue
                    for tokens in quant_row_counts(s):
                        launch(Q, torch.empty(tokens, fan_in, dtype=s.dtype, device=META))


def _piece_widths(layer: QuantLayer, widths: list[int]) -> list[int]:
    """The output widths of the GEMMs one merged projection runs as: all of it, or, when
    its parts may each keep their own activation order or static input scale (and only
    neighbours that share one are stacked), the width of every run of its parts."""
    if not (layer.actorder or (layer.fp8 and layer.activations == "static")):
        return [sum(widths)]
    runs = {sum(widths[i:j]) for i in range(len(widths)) for j in range(i + 1, len(widths) + 1)}
    return sorted(runs)


def _scale_dtype(scheme: str, s: EngineShapes) -> torch.dtype:
    """AWQ's and GPTQ's fp16 scales are made fp32 at load (quantized_formats.py);
    compressed-tensors' keep the checkpoint's dtype."""
    if scheme.startswith(("awq-", "gptq-")):
        return torch.float32
    return s.quant_scale_dtype or s.dtype


QuantLaunch = Callable[[ModuleType, torch.Tensor], object]


def _quant_launch(layer: QuantLayer, fan_in: int, n: int, dtype: torch.dtype,
                  scale_dtype: torch.dtype, arch: int,
                  weight_only: bool = False) -> QuantLaunch | None:  # fmt: skip
    """A function launching the GEMM of an [n, fan_in] linear on meta tensors laid out as
    the loader stores them (None when the scheme's groups do not divide the inputs). FP8
    before sm_89 runs weight-only (quant_ops.py)."""
    if layer.fp8:
        weight = torch.empty(n, fan_in, dtype=torch.float8_e4m3fn, device=META)
        # per row even for one per-tensor scale (repeated, so merged parts keep theirs)
        scale = torch.empty(n, 1, dtype=scale_dtype, device=META)
        static = layer.activations == "static"
        input_scale = torch.empty(1, dtype=scale_dtype, device=META) if static else None
        fp8 = layer.activations != "weight-only" and not weight_only
        if fp8 and arch >= FP8_TENSOR_CORES:
            return lambda Q, x: Q.fp8_gemm(x, weight, scale, input_scale)
        return lambda Q, x: Q.fp8_weight_only_gemm(x, weight, scale)
    group_size = layer.group_size or fan_in
    if fan_in % group_size:
        return None
    groups, bits = fan_in // group_size, layer.bits
    # the checkpoint's layout: input-major packed words, [out, groups] scales
    packed = torch.empty(n, fan_in * bits // 32, dtype=torch.int32, device=META)
    scales = torch.empty(n, groups, dtype=scale_dtype, device=META)
    # packed along the outputs group by group, then transposed (QuantizedLinear._weights):
    # with one group, .contiguous() keeps the transposed strides
    zero = torch.empty(groups, -(-n * bits // 32), dtype=torch.int32, device=META).t().contiguous()
    g_idx = torch.empty(fan_in, dtype=torch.int32, device=META)
    return lambda Q, x: Q.int_weight_gemm(x, packed, scales, bits, zero if layer.asym else None,
                                          g_idx if layer.actorder else None)  # fmt: skip
