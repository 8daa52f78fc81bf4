"""bench/memory_pool_trace.py runs its whole trace on every engine at tiny sizes and ends with
one JSON object whose comparisons come from the same run's figures."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_trace_runs_on_the_pool_and_the_fixed_splits_and_prints_its_json(tmp_path):
    args = ["--adapters", "4", "--kv-adapters", "2", "--cycles", "1", "--phase-requests", "4",
            "--concurrency", "2", "--short-output", "2", "--long-prompt", "48",
            "--long-output", "4", "--kv-cache-mib", "160", "--max-cpu-loras", "4",
            "--splits", "2,1"]  # fmt: skip
    env = os.environ | {"LORAPLEX_VAR_DIR": os.environ.get("LORAPLEX_VAR_DIR", str(tmp_path))}
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "memory_pool_trace.py"), *args],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    figures = json.loads(run.stdout.strip().splitlines()[-1])
    assert set(figures["engines"]) == {"pool", "fixed-2", "fixed-1"}
    for engine in figures["engines"].values():
        for part in ("whole", "adapters", "kv"):
            assert engine[part]["tok_s"] > 0
    comparison = figures["comparison"]
    best = comparison["better_fixed_split"]
    pool, fixed = figures["engines"]["pool"]["whole"], figures["engines"][best]["whole"]
    assert comparison["throughput_vs_better_fixed"] == round(pool["tok_s"] / fixed["tok_s"], 3)
