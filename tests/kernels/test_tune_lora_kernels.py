"""bench/tune_lora_kernels.py runs end to end on CPU (--interpret, tiny shapes), so the
tuner is known to work before a GPU is lent, and the table it writes is one the kernels load."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

from inference.kernels.lora_tiles import Tiles, load_table
from inference.kernels.tile_limits import launch_problem, limits_for_capability

ROOT = Path(__file__).resolve().parents[2]


def test_tuner_runs_under_the_interpreter_and_writes_a_loadable_table(tmp_path):
    out = tmp_path / "lora_tiles_interpret.json"
    result = _run("--interpret", "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["rejected"] == [] and summary["untuned_keys"] == 0
    assert summary["max_rel_err"] <= 1e-4
    assert summary["speedup_geomean"] >= 1.0  # the default is a candidate: never slower
    ops_paths = {(row["op"], row["path"]) for row in summary["table"]}
    assert ops_paths == {(op, p) for op in ("shrink", "expand") for p in ("sgmv", "bgmv")}
    table = load_table(out)
    for row in summary["table"]:
        key = tuple(row[f] for f in ("op", "path", "rank", "hidden", "batch"))
        assert dataclasses.asdict(table.entries[key]) == row["tiles"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    """The script in a fresh process, without TRITON_INTERPRET: it must set that itself."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run(
        [sys.executable, "bench/tune_lora_kernels.py", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_a_rank_that_is_not_positive_is_refused():
    result = _run("--interpret", "--ranks", "16", "0")
    assert result.returncode == 2
    assert "argument --ranks: 0 is not a positive integer" in result.stderr


def test_without_a_gpu_it_says_to_use_the_interpreter():
    result = _run()  # this host has no CUDA device
    assert result.returncode == 1
    assert "no CUDA device: run with --interpret" in result.stderr


def test_candidates_the_gpu_could_not_launch_are_skipped_with_the_reason():
    sys.path.insert(0, str(ROOT / "bench"))
    import tune_lora_kernels as tuner

    hopper = limits_for_capability(9, 0)

    def problem(tiles: Tiles) -> str | None:
        return launch_problem("shrink", "sgmv", tiles, 64, 2, hopper)

    default = Tiles(block_m=64, block_k=128, num_stages=3)  # a prefill shrink, at rank 64
    chosen, refused = tuner.candidates("shrink", "sgmv", default, 1000, problem)
    assert chosen[0] == default and all(problem(t) is None for t in chosen)
    deep = Tiles(block_m=128, block_k=256, num_stages=4, num_warps=8)
    assert (deep, "needs 262,144 B of shared memory, the device allows 232,448") in refused
    few, _ = tuner.candidates("shrink", "sgmv", default, 3, problem)
    assert few == chosen[:3]  # skipped tilings never count against the limit
