"""bench/memory_pool_trace.py runs its whole trace on every engine at tiny sizes, in a closed
loop, with Poisson arrivals and on an emulated GPU, and ends with one JSON object whose
comparisons come from the same run's figures; its fixed splits keep their slots' pages."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


EMULATED = ["--emulate-device", "h100", "--emulate-model", "llama-3-8b"]


@pytest.mark.parametrize(
    "arrivals", [[], ["--load", "0.8"], EMULATED], ids=["closed", "poisson", "emulated"]
)
def test_the_trace_runs_on_the_pool_and_the_fixed_splits_and_prints_its_json(tmp_path, arrivals):
    args = ["--adapters", "4", "--kv-adapters", "2", "--cycles", "2", "--adapter-requests", "4",
            "--adapter-concurrency", "2", "--short-output", "2", "--kv-requests", "2",
            "--kv-concurrency", "2", "--long-prompt", "48", "--long-output", "4",
            "--max-cpu-loras", "4", "--splits", "2,1", *arrivals]  # fmt: skip
    env = os.environ | {"LORAPLEX_VAR_DIR": os.environ.get("LORAPLEX_VAR_DIR", str(tmp_path))}
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "memory_pool_trace.py"), *args],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    figures = json.loads(run.stdout.strip().splitlines()[-1])
    poisson = "--load" in arrivals
    assert figures["arrivals"] == ("poisson" if poisson else "closed loop")
    assert (figures["emulated"] is not None) == (arrivals == EMULATED)
    assert set(figures["engines"]) == {"pool", "fixed-2", "fixed-1"}
    for name, engine in figures["engines"].items():
        for part in ("whole", "adapters", "kv"):
            assert engine[part]["tok_s"] > 0
        if name != "pool":  # reserved: the slots never lend their pages to the KV side
            assert engine["slots"] == int(name.removeprefix("fixed-"))
            assert engine["pool"]["resizes"] == {"kv_to_adapter": 0, "adapter_to_kv": 0}
    comparison = figures["comparison"]
    best = comparison["better_fixed_split"]
    pool, fixed = figures["engines"]["pool"]["whole"], figures["engines"][best]["whole"]
    assert comparison["throughput_vs_better_fixed"] == round(pool["tok_s"] / fixed["tok_s"], 3)
    assert comparison["vs"][best]["ttft_p99"] == round(pool["ttft_p99_s"] / fixed["ttft_p99_s"], 3)
    if poisson:
        assert set(figures["arrival_rates"]) == {"adapters", "kv"}
    else:  # phases back to back: no split's whole trace beats its best phases combined
        bound = comparison["best_of_each_phase_tok_s"]
        assert all(bound >= fixed["whole"]["tok_s"] * 0.999 for name, fixed in
                   figures["engines"].items() if name != "pool")  # fmt: skip
