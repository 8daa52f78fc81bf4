"""bench/cpu_sampling.py decodes one batch greedily and at a temperature, side by side, and
ends with one JSON object of its figures."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_bench_times_both_temperatures_and_prints_its_json(tmp_path):
    env = os.environ | {"LORAPLEX_VAR_DIR": os.environ.get("LORAPLEX_VAR_DIR", str(tmp_path))}
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "cpu_sampling.py"),
         "--batch", "4", "--steps", "2", "--rounds", "1"],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    figures = json.loads(run.stdout.strip().splitlines()[-1])
    assert figures["batch"] == 4 and figures["vocab"] == 49152
    assert figures["greedy_step_ms"] > 0 and figures["temperature_step_ms"] > 0
    assert figures["sampler_ms_temperature"] > 0 and figures["goal_share"] == 0.10
