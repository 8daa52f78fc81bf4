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

import math

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
