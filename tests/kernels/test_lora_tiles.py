"""The LoRA tile table: exact and nearest lookups, and the JSON file a tuning run writes."""

import json
from pathlib import Path

import pytest

from inference.kernels.lora_tiles import (
    DEFAULT_TABLE,
    Tiles,
    TileTable,
    default_tiles,
    gpu_slug,
    load_table,
    table_file,
    table_for_gpu,
)

ROOT = Path(__file__).resolve().parents[2]
KEY = ("shrink", "bgmv", 16, 4096, 1)


def _write(tmp_path, data, name="lora_tiles_h200.json"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def _entry(**changes):
    row = {"op": "expand", "path": "sgmv", "rank": 16, "hidden": 4096, "batch": 512,
           "tiles": {"block_m": 32, "block_n": 128, "num_warps": 8}}  # fmt: skip
    return row | changes


def test_exact_key_gives_its_entry():
    assert DEFAULT_TABLE.lookup(*KEY) == default_tiles(*KEY)
    table = TileTable({KEY: Tiles(block_k=64, split_k=2)})
    assert table.lookup(*KEY) == Tiles(block_k=64, split_k=2)


def test_shape_between_entries_gets_the_nearest_of_the_same_op_and_path():
    small, large = Tiles(block_k=64), Tiles(block_k=256)
    table = TileTable(
        {
            ("shrink", "bgmv", 16, 4096, 4): small,
            ("shrink", "bgmv", 16, 4096, 64): large,
            ("expand", "bgmv", 16, 4096, 6): Tiles(block_n=16),  # other op: never chosen
        }
    )
    assert table.lookup("shrink", "bgmv", 16, 4096, 6) == small  # log2 gaps 0.6 and 3.4
    assert table.lookup("shrink", "bgmv", 16, 4096, 32) == large
    assert table.lookup("shrink", "bgmv", 12, 5000, 2) == small
    # An exact tie (batch 16: 2 from both sides) picks the smaller key, whatever the order.
    assert table.lookup("shrink", "bgmv", 16, 4096, 16) == small
    reversed_table = TileTable(dict(reversed(list(table.entries.items()))))
    assert reversed_table.lookup("shrink", "bgmv", 16, 4096, 16) == small


def test_defaults_cover_every_op_and_path_for_any_shape():
    for op in ("shrink", "expand"):
        for path in ("sgmv", "bgmv"):
            assert isinstance(DEFAULT_TABLE.lookup(op, path, 7, 576, 3000), Tiles)


def test_lookup_of_an_op_the_table_lacks_is_refused():
    with pytest.raises(ValueError, match="no expand/sgmv entry"):
        TileTable({KEY: Tiles()}).lookup("expand", "sgmv", 16, 4096, 1)


def test_json_file_replaces_the_defaults_of_its_keys_only(tmp_path):
    path = _write(tmp_path, {"gpu": "NVIDIA H200", "entries": [_entry()]})
    table = load_table(path)
    assert table.lookup("expand", "sgmv", 16, 4096, 512) == Tiles(
        block_m=32, block_n=128, num_warps=8
    )  # fields the file leaves out keep Tiles' defaults
    assert table.lookup(*KEY) == DEFAULT_TABLE.lookup(*KEY)
    assert DEFAULT_TABLE.lookup("expand", "sgmv", 16, 4096, 512) == default_tiles(
        "expand", "sgmv", 16, 4096, 512
    )  # loading never changes the defaults themselves


def test_the_gpu_models_file_is_used_when_present(tmp_path):
    _write(tmp_path, {"entries": [_entry()]}, name=table_file("NVIDIA H200", tmp_path).name)
    tuned = table_for_gpu("NVIDIA H200", tmp_path)
    assert tuned.lookup("expand", "sgmv", 16, 4096, 512).block_m == 32
    assert table_for_gpu("NVIDIA A100-SXM4-80GB", tmp_path) is DEFAULT_TABLE
    assert table_for_gpu(None, tmp_path) is DEFAULT_TABLE


def test_gpu_slug_names_the_file():
    assert gpu_slug("NVIDIA H100 80GB HBM3") == "h100_80gb_hbm3"
    assert table_file("NVIDIA H200") == ROOT / "bench" / "results" / "lora_tiles_h200.json"


def test_table_round_trips_through_json(tmp_path):
    keys = [KEY, ("expand", "sgmv", 64, 14336, 2048)]
    path = _write(tmp_path, DEFAULT_TABLE.to_json("NVIDIA H200", keys))
    loaded = load_table(path, base=TileTable({}))
    assert loaded.entries == {k: DEFAULT_TABLE.entries[k] for k in keys}


BAD_FILES = {
    "not-json": ("{entries: [", "cannot read it as JSON"),
    "no-entries": ({"gpu": "H200"}, 'an object with an "entries" list'),
    "entries-not-list": ({"entries": {"op": "shrink"}}, '"entries" list'),
    "entry-not-object": ({"entries": [[1, 2]]}, r"entries\[0\]: must be an object"),
    "missing-key": ({"entries": [{"op": "shrink"}]}, "must have exactly the keys"),
    "extra-key": ({"entries": [_entry(note="x")]}, "must have exactly the keys"),
    "unknown-op": ({"entries": [_entry(op="merge")]}, "op='merge' is not one of"),
    "unknown-path": ({"entries": [_entry(path="gemm")]}, "path='gemm' is not one of"),
    "zero-rank": ({"entries": [_entry(rank=0)]}, "rank=0 must be a positive integer"),
    "float-batch": ({"entries": [_entry(batch=1.5)]}, "batch=1.5 must be a positive integer"),
    "bool-hidden": ({"entries": [_entry(hidden=True)]}, "hidden=True must be a positive"),
    "tiles-not-object": ({"entries": [_entry(tiles=[64])]}, "tiles must be an object"),
    "unknown-field": (
        {"entries": [_entry(tiles={"blockk": 64})]}, r"unknown tile fields \['blockk'\]"
    ),
    "not-power-of-two": (
        {"entries": [_entry(tiles={"block_k": 100})]},
        "block_k=100 must be a power of two in 16..512",
    ),
    "tile-too-small": (
        {"entries": [_entry(tiles={"block_m": 8})]}, "block_m=8 must be a power of two in 16..128"
    ),
    "zero-split": (
        {"entries": [_entry(tiles={"split_k": 0})]}, "split_k=0 must be an integer in 1..64"
    ),
    "three-warps": (
        {"entries": [_entry(tiles={"num_warps": 3})]}, "num_warps=3 must be a power of two"
    ),
    "string-stages": (
        {"entries": [_entry(tiles={"num_stages": "3"})]}, "num_stages='3' must be an integer"
    ),
    "too-many-stages": (
        {"entries": [_entry(tiles={"num_stages": 9})]}, "num_stages=9 must be an integer in 1..8"
    ),
    "duplicate-key": ({"entries": [_entry(), _entry()]}, r"entries\[1\]: key .* appears twice"),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD_FILES)
def test_a_bad_file_is_refused_with_the_reason(tmp_path, case):
    data, reason = BAD_FILES[case]
    path = _write(tmp_path, data)
    with pytest.raises(ValueError, match=reason) as error:
        load_table(path)
    assert str(path) in str(error.value)


def test_a_bad_file_for_the_gpu_is_refused_not_skipped(tmp_path):
    _write(tmp_path, {"entries": [_entry(tiles={"block_n": 48})]}, name="lora_tiles_h100.json")
    with pytest.raises(ValueError, match="block_n=48 must be a power of two"):
        table_for_gpu("NVIDIA H100", tmp_path)


def test_an_unreadable_file_is_refused(tmp_path):
    path = tmp_path / "lora_tiles_h200.json"
    path.write_bytes(b"\xff\xfe\x00not utf-8")
    with pytest.raises(ValueError, match="cannot read it as JSON"):
        load_table(path)
