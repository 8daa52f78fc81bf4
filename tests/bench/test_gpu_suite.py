"""bench/gpu_suite.py works before any GPU sees it: `--interpret` runs every section's code
on CPU (tiny shapes, Triton's interpreter) and prints the JSON report last; wrong
arguments are refused with a message."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "bench" / "gpu_suite.py"
SECTIONS = [
    "environment",
    "kernels",
    "correctness",
    "copy_bandwidth",
    "serving_model",
    "decode_throughput",
    "memory_bandwidth",
    "ttft",
    "transformers_generate",
    "lora_batch",
    "lora_swap",
]


def run_suite(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SUITE), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    done = run_suite("--interpret", "--workdir", str(tmp_path_factory.mktemp("suite")))
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_section_runs_under_the_interpreter(report):
    assert report["mode"] == "interpret"
    assert list(report["sections"]) == SECTIONS
    failed = {k: v for k, v in report["sections"].items() if v["status"] != "ok"}
    assert not failed, failed


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
    eager = sections["decode_throughput"]["eager"]
    assert [row["batch"] for row in eager] == [1, 2, 4]
    assert all(row["tokens_per_s"] > 0 for row in eager)
    graphs = sections["decode_throughput"]["graphs"]
    assert graphs == "not built" or [row["batch"] for row in graphs] == [1, 2, 4]
    assert not any(sections["decode_throughput"]["graphs_captured"].values())  # CPU: eager
    assert all(row["share_of_copy"] > 0 for row in sections["memory_bandwidth"]["eager"])
    assert sections["ttft"]["prefix_cache_hits"] > 0
    assert all("tokens_per_s" in row for row in sections["transformers_generate"]["rows"])
    lora = sections["lora_batch"]
    assert lora["lora"]["distinct_adapters"] == 4 and lora["ratio"] > 0
    assert sections["lora_swap"]["swap_in_p99_ms"] > 0
    assert report["goals"]["timings_meaningful"] is False


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--interpret", "--budget", "0"], "the budget must be more than 0 seconds"),
        (["--interpret", "--budget", "soon"], "'soon' is not a number of seconds"),
        (["--interpret", "--workdir", "/no/such/folder"], "is not an existing folder"),
    ],
)
def test_bad_arguments_are_refused(args, message):
    done = run_suite(*args, timeout=60)
    assert done.returncode == 2
    assert message in done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has a GPU")
def test_without_a_gpu_it_says_to_use_interpret():
    done = run_suite(timeout=120)
    assert done.returncode == 1
    assert "no CUDA device here; run with --interpret" in done.stderr


def test_a_spent_budget_skips_the_rest_and_still_reports(tmp_path):
    done = run_suite("--interpret", "--budget", "6", "--workdir", str(tmp_path))
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert list(report["sections"]) == SECTIONS
    statuses = {v["status"] for v in report["sections"].values()}
    assert "skipped" in statuses or "timeout" in statuses
