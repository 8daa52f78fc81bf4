"""The GPU suite's quantized-base decode section runs under `--interpret`: the served model
quantized by the section itself (FP8 and 4-bit, the engine's packing), each served with the
adapters beside the unquantized base, and every batch size measured."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "bench" / "gpu_suite.py"


def test_quantized_decode_runs_under_the_interpreter(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            str(SUITE),
            "--interpret",
            "--workdir",
            str(tmp_path),
            "--sections",
            "environment,serving_model,quant_decode",
        ],  # fmt: skip
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    section = json.loads(done.stdout.strip().splitlines()[-1])["sections"]["quant_decode"]
    assert section["status"] == "ok", section
    schemes = section["schemes"]
    # the tiny model's inputs (64) take groups of 64, Llama-3-8B's of 128
    assert {k: v["scheme"] for k, v in schemes.items()} == {
        "fp8-dynamic": "fp8-dynamic",
        "w4a16": "w4a16-g64",
        "unquantized": None,
    }
    base = schemes["unquantized"]["weight_bytes"]
    assert 0 < schemes["w4a16"]["weight_bytes"] < schemes["fp8-dynamic"]["weight_bytes"] < base
    for name in ("fp8-dynamic", "w4a16"):
        rows = schemes[name]["rows"]
        assert [r["batch"] for r in rows] == [1, 2, 4]
        assert all(r["tokens_per_s"] > 0 and r["over_unquantized"] > 0 for r in rows), rows
        assert rows[-1]["distinct_adapters"] == section["adapters"]
    assert not list(tmp_path.glob("served-*"))  # the quantized copies are removed
