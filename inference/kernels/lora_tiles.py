"""Tile sizes of the LoRA kernels per shape: a small table keyed by (op, path, rank, hidden
size, batch size), Hopper bf16 defaults reasoned from the shapes, and a JSON file from a
tuning run on a GPU (bench/tune_lora_kernels.py) that replaces them without code changes.

`hidden` is the reduction length for shrink (input features) and the widest output slice
for expand; `batch` is the tokens of the step; `rank` the stacked rank. A shape between
entries gets the nearest one (log2 distance summed over rank, hidden and batch).

The JSON file, bench/results/lora_tiles_<gpu>.json (<gpu> from `gpu_slug`):
    {"gpu": "NVIDIA H200", "entries": [{"op": "shrink", "path": "bgmv", "rank": 16,
      "hidden": 4096, "batch": 1, "tiles": {"block_k": 256, "split_k": 16, ...}}, ...]}
Its entries override the defaults of the same key; tile fields it leaves out keep Tiles'
defaults. A file that breaks these rules, or names a tile the device cannot launch
(tile_limits.py), is refused with the entry and the reason, never half-used.
"""

import functools
import json
import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, fields
from itertools import product
from pathlib import Path
from typing import Any

from inference.kernels.tile_limits import DeviceLimits, launch_problem

OPS = ("shrink", "expand")
PATHS = ("sgmv", "bgmv")
RANKS = (8, 16, 32, 64)
HIDDENS = (1024, 4096, 14336)
BATCHES = (1, 8, 32, 128, 512, 2048)
RESULTS_DIR = Path(__file__).resolve().parents[2] / "bench" / "results"

# Allowed values per field: tiles are powers of two, as tl.arange needs, from the smallest
# tl.dot tile (16) to tiles whose registers still fit; anything else in a file is refused.
LIMITS = {
    "block_m": (16, 128),
    "block_k": (16, 512),
    "block_n": (16, 512),
    "split_k": (1, 64),  # any integer: programs per reduction
    "num_warps": (1, 16),
    "num_stages": (1, 8),  # any integer: software pipelining depth
}
ANY_INTEGER = ("split_k", "num_stages")

TileKey = tuple[str, str, int, int, int]
KEY_FIELDS = ("op", "path", "rank", "hidden", "batch")


@dataclass(frozen=True)
class Tiles:
    """One launch's tiling. Fields an op or path does not use are ignored by it."""

    block_m: int = 64  # SGMV: most tokens of a segment per program (capped by the segment)
    block_k: int = 128  # shrink: input features per loop step
    block_n: int = 64  # expand: output columns per program
    split_k: int = 1  # shrink: programs sharing one reduction (fp32 atomics; capped by K)
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self) -> None:
        for name, (low, high) in LIMITS.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{name}={value!r} must be an integer")
            pow2 = name in ANY_INTEGER or (value > 0 and value & (value - 1) == 0)
            if not (low <= value <= high and pow2):
                kind = "an integer" if name in ANY_INTEGER else "a power of two"
                raise ValueError(f"{name}={value} must be {kind} in {low}..{high}")


# --- Hopper (H100/H200) bf16 defaults -------------------------------------------------------
# 132 SMs, ~4.8 TB/s of HBM, 228 KB of shared memory and 64K registers per SM. At LoRA ranks
# every one of these products is memory bound: shrink does 2*R flops per input element read
# (32 at rank 16), expand 2*R per output element written, far under the ~100 flops/byte
# where tf32 tensor cores would become the limit. So the tiles aim at (1) enough programs in
# flight to cover HBM latency, (2) long contiguous loads, (3) registers within budget.
PROGRAMS_IN_FLIGHT = 512  # ~4 programs per SM: what hides a ~1 us HBM round trip
REGISTER_TILE = 4096  # fp32 elements of a vector-matrix tile: 32 per thread at 4 warps


def _pow2_at_most(n: float) -> int:
    return 1 << max(0, int(math.floor(math.log2(max(n, 1)))))


def _pow2_at_least(n: float) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def _clamp(n: int, low: int, high: int) -> int:
    return max(low, min(high, n))


def default_tiles(op: str, path: str, rank: int, hidden: int, batch: int) -> Tiles:
    """The Hopper bf16 tiles for one shape, derived from the reasoning above."""
    block_r = max(16, _pow2_at_least(rank))  # the kernels pad the rank to this
    if path == "bgmv" and op == "shrink":
        # Decode: a program reads one token's A (R x K, 128 KB at rank 16 and K 4096) in
        # R x BLOCK_K tiles. Wide K tiles (512 B rows at rank 16) within the register tile.
        # With one program per (token, slice), batch 1 would leave 3 programs each looping
        # over 16 dependent loads: latency bound. Split K until PROGRAMS_IN_FLIGHT run, so a
        # small batch costs about one load round trip (plus the y.zero_ the split needs).
        block_k = _clamp(REGISTER_TILE // block_r, 64, 256)
        chunks = max(1, hidden // block_k)
        split = _clamp(_pow2_at_least(PROGRAMS_IN_FLIGHT / batch), 1, min(32, chunks))
        return Tiles(block_k=block_k, split_k=split, num_warps=4, num_stages=2)
    if path == "bgmv":
        # Decode expand: a program writes BLOCK_N columns of one token from a BLOCK_N x R
        # tile of B, contiguous in memory ([S, width, R]). No loop, so nothing to pipeline.
        # Small batches take narrow tiles to keep PROGRAMS_IN_FLIGHT programs; larger ones
        # widen them up to the register tile, fewer programs for the same bytes.
        block_n = _pow2_at_most(batch * hidden / PROGRAMS_IN_FLIGHT)
        block_n = _clamp(block_n, 32, min(256, REGISTER_TILE // block_r))
        return Tiles(block_n=block_n, num_warps=4 if block_n * block_r >= 2048 else 2,
                     num_stages=1)  # fmt: skip
    if op == "shrink":
        # Prefill: tl.dot of a BLOCK_M x BLOCK_K slab of x (256 B rows) with A's K x R tile.
        # x is the traffic (read once per slice), so 64-token blocks and 3 stages of
        # cp.async pipelining: at most 48 KB of shared memory in the sm_90 build. Rank 64
        # halves BLOCK_K to keep the A stages and dot operands in the same budget. A few
        # long segments give few programs: split K for those, leaving each program at
        # least 4 loop steps to pipeline.
        block_m = 64 if batch >= 64 else _clamp(_pow2_at_least(batch), 16, 64)
        block_k = 128 if block_r <= 32 else 64
        programs = max(1, batch // block_m)
        chunks = max(1, hidden // block_k)
        split = _clamp(_pow2_at_least(PROGRAMS_IN_FLIGHT / programs), 1, max(1, chunks // 4))
        return Tiles(block_m=block_m, block_k=block_k, split_k=min(split, 16), num_stages=3)
    # Prefill expand: tl.dot of the token block's y (M x R) with B's R x BLOCK_N tile, one
    # output tile written (and read, to add) per program: 128 columns = 256 B rows. No loop.
    # At rank 64 B's tile is 4x rank 16's, so 8 warps share it; so do 64 x 128 output tiles,
    # whose accumulator and added output at 4 warps use all 255 registers and spill on sm_80.
    block_m = 64 if batch >= 64 else _clamp(_pow2_at_least(batch), 16, 64)
    wide_enough = (batch // block_m) * (hidden // 128) >= PROGRAMS_IN_FLIGHT
    block_n = 128 if wide_enough else 64
    warps = 8 if block_r >= 64 or block_m * block_n >= 64 * 128 else 4
    return Tiles(block_m=block_m, block_n=block_n, num_warps=warps, num_stages=1)


class TileTable:
    """Tiles per key, looked up by exact key or else the nearest entry of the same op/path."""

    def __init__(self, entries: Mapping[TileKey, Tiles]) -> None:
        self.entries = dict(entries)
        self._memo: dict[TileKey, Tiles] = {}

    def merged(self, entries: Mapping[TileKey, Tiles]) -> "TileTable":
        return TileTable({**self.entries, **entries})

    def lookup(self, op: str, path: str, rank: int, hidden: int, batch: int) -> Tiles:
        key = (op, path, rank, hidden, batch)
        tiles = self._memo.get(key)
        if tiles is None:
            if len(self._memo) >= 4096:  # batch sizes vary per step; keep the memo bounded
                self._memo.clear()
            tiles = self._memo[key] = self._nearest(key)
        return tiles

    def _nearest(self, key: TileKey) -> Tiles:
        return self.entries[self._nearest_key(key)]

    def _nearest_key(self, key: TileKey) -> TileKey:
        if key in self.entries:
            return key
        candidates = [k for k in self.entries if k[:2] == key[:2]]
        if not candidates:
            raise ValueError(f"the tile table has no {key[0]}/{key[1]} entry")

        def distance(k: TileKey) -> tuple[float, TileKey]:
            pairs = zip(k[2:], key[2:], strict=True)
            gap = sum(abs(math.log2(max(a, 1) / max(b, 1))) for a, b in pairs)
            return gap, k  # ties: the smaller key, so the choice never depends on order

        return min(candidates, key=distance)

    def reachable(self, op: str, path: str, rank: int, hidden: int, max_batch: int) -> set[TileKey]:
        """The keys whose tiles a lookup of (op, path, rank, hidden, b) returns for some b in
        1..max_batch. A key's distance minus another's is monotonic in log2(b), so each key
        wins over one interval of batches: where both ends of a range agree, so does all of
        it, and bisecting finds every key with a few dozen lookups."""

        def winner(batch: int) -> TileKey:
            return self._nearest_key((op, path, rank, hidden, batch))

        found: set[TileKey] = set()
        ranges = [(1, max(1, max_batch), winner(1), winner(max(1, max_batch)))]
        while ranges:
            low, high, low_key, high_key = ranges.pop()
            if low_key == high_key or high - low <= 1:
                found.update((low_key, high_key))
                continue
            mid = (low + high) // 2
            mid_key = winner(mid)
            ranges += [(low, mid, low_key, mid_key), (mid, high, mid_key, high_key)]
        return found

    def to_json(self, gpu: str, keys: list[TileKey] | None = None) -> dict[str, Any]:
        """The file format (see the module docstring), of `keys` or every entry."""
        rows = []
        for k in self.entries if keys is None else keys:
            tiles = self.entries[k]
            row: dict[str, Any] = dict(zip(KEY_FIELDS, k, strict=True))
            row["tiles"] = {f.name: getattr(tiles, f.name) for f in fields(Tiles)}
            rows.append(row)
        return {"gpu": gpu, "entries": rows}


DEFAULT_TABLE = TileTable(
    {key: default_tiles(*key) for key in product(OPS, PATHS, RANKS, HIDDENS, BATCHES)}
)


def _entry(row: object) -> tuple[TileKey, Tiles]:
    if not isinstance(row, dict):
        raise ValueError(f"must be an object, got {type(row).__name__}")
    expected = {*KEY_FIELDS, "tiles"}
    if set(row) != expected:
        raise ValueError(f"must have exactly the keys {sorted(expected)}, got {sorted(row)}")
    if row["op"] not in OPS:
        raise ValueError(f"op={row['op']!r} is not one of {OPS}")
    if row["path"] not in PATHS:
        raise ValueError(f"path={row['path']!r} is not one of {PATHS}")
    for name in ("rank", "hidden", "batch"):
        value = row[name]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer")
    tiles = row["tiles"]
    if not isinstance(tiles, dict):
        raise ValueError(f"tiles must be an object, got {type(tiles).__name__}")
    unknown = set(tiles) - {f.name for f in fields(Tiles)}
    if unknown:
        raise ValueError(f"unknown tile fields {sorted(unknown)}; known: {sorted(LIMITS)}")
    key = (row["op"], row["path"], row["rank"], row["hidden"], row["batch"])
    return key, Tiles(**tiles)


def describe(key: TileKey) -> str:
    """A key as the file spells it: (op=shrink, path=sgmv, rank=64, hidden=4096, batch=512)."""
    return f"({', '.join(f'{name}={value}' for name, value in zip(KEY_FIELDS, key, strict=True))})"


def load_table(
    path: Path,
    base: TileTable = DEFAULT_TABLE,
    limits: DeviceLimits | None = None,
    itemsize: int = 2,
) -> TileTable:
    """`base` with the file's entries in place of its own: ValueError naming the file and the
    entry at fault if the file is not a valid table, or, given a device's `limits`, if an
    entry's tiles could not launch there at its rank with `itemsize`-byte elements."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"LoRA tile table {path}: cannot read it as JSON: {error}") from None
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise ValueError(f'LoRA tile table {path}: expected an object with an "entries" list')
    entries: dict[TileKey, Tiles] = {}
    for i, row in enumerate(data["entries"]):
        try:
            key, tiles = _entry(row)
        except (ValueError, TypeError) as error:
            raise ValueError(f"LoRA tile table {path}: entries[{i}]: {error}") from None
        if key in entries:
            raise ValueError(f"LoRA tile table {path}: entries[{i}]: key {key} appears twice")
        if limits is not None and (
            problem := launch_problem(key[0], key[1], tiles, key[2], itemsize, limits)
        ):
            raise ValueError(f"LoRA tile table {path}: entries[{i}] {describe(key)}: {problem}")
        entries[key] = tiles
    return base.merged(entries)


def check_defaults(limits: DeviceLimits, itemsize: int = 2) -> None:
    """The default table's tiles against a device's limits: ValueError naming the first that
    could not launch (defaults reasoned for Hopper, on a smaller GPU)."""
    for key, tiles in DEFAULT_TABLE.entries.items():
        problem = launch_problem(key[0], key[1], tiles, key[2], itemsize, limits)
        if problem:
            raise ValueError(f"the default LoRA tile table: {describe(key)}: {problem}")


def gpu_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100_80gb_hbm3': the <gpu> of the table's file name."""
    slug = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
    return slug.removeprefix("nvidia_") or "unknown"


def table_file(gpu_name: str, results_dir: Path = RESULTS_DIR) -> Path:
    return results_dir / f"lora_tiles_{gpu_slug(gpu_name)}.json"


def check_reachable(
    table: TileTable,
    limits: DeviceLimits,
    itemsize: int,
    rank: int,
    hiddens: Mapping[str, Collection[int]],
    max_batch: int,
) -> None:
    """Every entry a lookup at `rank` can reach, for `hiddens` per op and batches up to
    `max_batch` on either path, checked at that rank (an engine pads every adapter to one
    rank, which may not be the entry's): ValueError naming the first that cannot launch."""
    for op, sizes in hiddens.items():
        for path, hidden in product(PATHS, sorted(set(sizes))):
            for key in sorted(table.reachable(op, path, rank, hidden, max_batch)):
                problem = launch_problem(op, path, table.entries[key], rank, itemsize, limits)
                if problem:
                    raise ValueError(f"{describe(key)} at rank {rank}: {problem}")


@functools.lru_cache(maxsize=16)
def table_for_gpu(
    gpu_name: str | None,
    results_dir: Path = RESULTS_DIR,
    limits: DeviceLimits | None = None,
    itemsize: int = 2,
) -> TileTable:
    """The table for a GPU model: its tuned file when there is one, else the defaults.
    None (a CPU under the interpreter) always gets the defaults. Given the device's
    `limits`, a tile it could not launch is refused (ValueError). Read once per process."""
    if gpu_name is None:
        return DEFAULT_TABLE
    if limits is not None:
        check_defaults(limits, itemsize)
    path = table_file(gpu_name, results_dir)
    return load_table(path, limits=limits, itemsize=itemsize) if path.is_file() else DEFAULT_TABLE
