"""bench/gpu_suite.py works before any GPU sees it: `--interpret` runs every section's code
on CPU (tiny shapes, Triton's interpreter), each in its own process, and prints the JSON
report last; a section whose module is not written yet is skipped as not available; wrong
arguments are refused with a message; `--plan` prints the budget without importing torch."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "bench" / "gpu_suite.py"
sys.path.insert(0, str(ROOT / "bench"))

from gpu_suite_plan import (  # noqa: E402
    ON_REQUEST,
    SECTIONS,
    TOTAL_S,
    plan,
    planned_total,
    unavailable,
)

NAMES = [s.name for s in SECTIONS]
UNAVAILABLE = {s.name: unavailable(s) for s in SECTIONS if unavailable(s)}


def run_suite(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SUITE), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("suite")
    out = folder / "report.json"
    done = run_suite("--interpret", "--workdir", str(folder), "--out", str(out))
    assert done.returncode == 0, done.stderr[-4000:]
    return last_json(done.stdout), json.loads(out.read_text())


@pytest.fixture(scope="module")
def report(run):
    return run[0]


def test_every_section_runs_under_the_interpreter_in_a_forked_process(report):
    assert report["mode"] == "interpret"
    assert report["isolation"] == "fork"
    assert list(report["sections"]) == NAMES
    failed = {k: v for k, v in report["sections"].items() if v["status"] != "ok"}
    assert {k: v.get("reason") for k, v in failed.items()} == UNAVAILABLE, failed
    assert report["skipped"] == [n for n in NAMES if n in UNAVAILABLE]
    assert report["stopped"] is None and report["interrupted_by"] is None


def test_the_report_file_has_what_the_last_line_has(run):
    printed, written = run
    assert written["sections"] == printed["sections"]
    assert written["goals"] == printed["goals"]


def test_the_engine_matches_transformers_and_the_kernels_their_reference(report):
    sections = report["sections"]
    correctness = sections["correctness"]
    assert correctness["tokens_equal"], correctness
    assert correctness["max_logit_abs_err"] < 1e-4
    kernels = sections["kernels"]
    assert kernels["match_reference"], kernels
    assert report["goals"]["greedy_matches_transformers"] is True
    assert report["goals"]["kernels_match_reference"] is True


def test_every_speed_figure_is_there(report):
    sections = report["sections"]
    assert sections["environment"]["copy"]["gb_per_s"] > 0
    for mode in ("decode_graphs", "decode_eager"):
        rows = sections[mode]["rows"]
        assert [row["batch"] for row in rows] == [1, 2, 4]
        assert all(row["tokens_per_s"] > 0 and row["share_of_copy"] > 0 for row in rows)
        assert sections[mode]["graphs_captured"] is False  # CPU: eager
    assert sections["ttft"]["prefix_cache_hits"] > 0
    rows = sections["transformers_generate"]["rows"]
    assert all(row["tokens_per_s"] > 0 for row in rows)
    assert all("engine_over_transformers" in row for row in rows if row["batch"] in (1, 4))
    lora = sections["lora_batch"]
    assert lora["lora"]["distinct_adapters"] == 4 and lora["ratio"] > 0
    assert report["goals"]["lora_over_base_engine"] > 0
    assert sections["lora_swap"]["swap_in_p99_ms"] > 0
    assert report["goals"]["timings_meaningful"] is False


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--interpret", "--budget", "0"], "the budget must be more than 0 seconds"),
        (["--interpret", "--budget", "soon"], "'soon' is not a number of seconds"),
        (["--interpret", "--workdir", "/no/such/folder"], "is not an existing folder"),
        (["--plan", "--sections", "kernels,warp_drive"], "no section warp_drive; see --plan"),
    ],
)
def test_bad_arguments_are_refused(args, message):
    done = run_suite(*args, timeout=60)
    assert done.returncode != 0
    assert message in done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has a GPU")
def test_without_a_gpu_it_says_to_use_interpret_and_still_reports():
    done = run_suite(timeout=120)
    assert done.returncode == 1
    assert "no CUDA device here; run with --interpret" in done.stderr
    report = last_json(done.stdout)
    assert report["sections"]["environment"]["cuda_available"] is False
    assert report["skipped"] == NAMES[1:]
    assert report["sections"]["kernels"]["reason"] == "no CUDA device here"


def test_a_budget_too_short_for_the_imports_skips_every_section_by_name(tmp_path):
    done = run_suite("--interpret", "--budget", "1", "--workdir", str(tmp_path))
    assert done.returncode == 0, done.stderr[-4000:]
    report = last_json(done.stdout)
    assert report["skipped"] == NAMES
    assert {v["reason"] for v in report["sections"].values()} == {"the suite's time budget ran out"}


def test_the_plan_fits_six_minutes_and_runs_correctness_first():
    assert planned_total() <= TOTAL_S == 360
    assert plan()["planned_s"] == planned_total()
    assert NAMES[:5] == ["environment", "correctness", "kernels", "compile_count", "nccl"]
    first = {kind: next(i for i, n in enumerate(NAMES) if n.startswith(kind))
             for kind in ("lora", "decode", "ttft")}  # fmt: skip
    assert first["lora"] < first["decode"] < first["ttft"]


PLAN_ALONE = """
import json, runpy, sys
sys.path.insert(0, {bench!r})
sys.argv = [{suite!r}, "--plan"]
runpy.run_path({suite!r}, run_name="__main__")
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "triton", "transformers"))
print(json.dumps(heavy), file=sys.stderr)
"""


def test_plan_prints_each_cap_without_importing_torch():
    script = PLAN_ALONE.format(bench=str(SUITE.parent), suite=str(SUITE))
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stderr.strip().splitlines()[-1]) == []
    printed = last_json(done.stdout)
    assert printed == json.loads(json.dumps(plan()))
    assert [row["section"] for row in printed["sections"]] == NAMES
    assert {r["section"]: r["unavailable"] for r in printed["sections"] if r["unavailable"]} == (
        UNAVAILABLE
    )
    assert "lora_batch" in done.stdout and "planned 360 s of a 360 s budget" in done.stdout


def test_sections_named_bring_the_ones_they_need():
    done = run_suite("--plan", "--sections", "ttft,kernels", timeout=60)
    assert [r["section"] for r in last_json(done.stdout)["sections"]] == [
        "kernels",
        "serving_model",
        "ttft",
    ]


def test_the_pool_trace_runs_only_when_named_and_compares_the_pool_with_fixed_splits(tmp_path):
    """Not part of the default run; named, it brings the served model and runs the pool and
    the fixed splits through one trace at one budget, each reporting both phases."""
    assert [s.name for s in ON_REQUEST] == ["pool_trace"] and "pool_trace" not in NAMES
    done = run_suite("--interpret", "--sections", "pool_trace", "--workdir", str(tmp_path))
    assert done.returncode == 0, done.stderr[-4000:]
    report = last_json(done.stdout)
    assert list(report["sections"]) == ["serving_model", "pool_trace"]
    trace = report["sections"]["pool_trace"]
    assert trace["status"] == "ok", trace
    assert set(trace["engines"]) == {"pool", "fixed-4", "fixed-2"}
    for name, engine in trace["engines"].items():
        assert "error" not in engine, (name, engine)
        assert all(engine[part]["tok_s"] > 0 for part in ("whole", "adapters", "kv"))
    assert trace["engines"]["fixed-2"]["slots"] == 2
    assert set(trace["comparison"]["vs"]) == {"fixed-4", "fixed-2"}
