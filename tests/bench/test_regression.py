"""bench/regression.py's pure parts: its arguments, a bench's last-line figures, and ours
against theirs, without running any bench."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import regression  # noqa: E402


def test_the_arguments_default_to_every_bench_in_two_rounds():
    args = regression.parse_args(["--against", "70389ca"])
    assert args.against == "70389ca" and args.rounds == 2 and args.model is None
    assert args.benches == list(regression.BENCHES)


def test_named_benches_run_in_order_once_each():
    argv = ["--against", "HEAD~1", "--bench", "lora_mixed_batch", "--bench",
            "engine_throughput", "--bench", "lora_mixed_batch", "--rounds", "3"]  # fmt: skip
    args = regression.parse_args(argv)
    assert args.benches == ["lora_mixed_batch", "engine_throughput"] and args.rounds == 3


@pytest.mark.parametrize(
    "argv",
    [[], ["--against", "x", "--bench", "nope"], ["--against", "x", "--rounds", "0"]],
    ids=["no commit", "unknown bench", "no rounds"],
)
def test_bad_arguments_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        regression.parse_args(argv)
    assert "error" in capsys.readouterr().err


def test_a_bench_figures_are_its_last_non_empty_line():
    stdout = 'engine: 10 tok/s\n{"not": "last"}\n{"ratio": 1.5, "model": "m"}\n\n'
    assert regression.last_json(stdout) == {"ratio": 1.5, "model": "m"}
    with pytest.raises(ValueError):
        regression.last_json("\n\n")
    with pytest.raises(ValueError):
        regression.last_json("figures:\n[1, 2]\n")


def test_ours_against_theirs_is_above_one_when_ours_is_better():
    assert regression.ours_vs_theirs(1.8, 1.2, higher_is_better=True) == pytest.approx(1.5)
    assert regression.ours_vs_theirs(0.1, 0.2, higher_is_better=False) == pytest.approx(2.0)


def test_the_summary_compares_the_medians_of_the_rounds():
    bench = regression.BENCHES["engine_throughput"]
    ours = [{"ratio": 1.7}, {"ratio": 1.9}, {"ratio": 1.8}]
    theirs = [{"ratio": 1.1}, {"ratio": 1.2}, {"ratio": 1.0}]
    summary = regression.summarize(bench, ours, theirs)
    assert summary == {
        "ratio": {
            "ours": 1.8,
            "theirs": 1.1,
            "ours_vs_theirs": round(1.8 / 1.1, 3),
            "ours_rounds": [1.7, 1.9, 1.8],
            "theirs_rounds": [1.1, 1.2, 1.0],
        }
    }
    times = regression.summarize(
        regression.BENCHES["cpu_batch_change"],
        [{"steady_step_s": 0.1, "ttft_with_a_join_s": 0.5, "leave_step_s": 0.1}],
        [{"steady_step_s": 0.2, "ttft_with_a_join_s": 0.5, "leave_step_s": 0.4}],
    )
    assert [times[k]["ours_vs_theirs"] for k in times] == [2.0, 1.0, 4.0]


def test_a_bench_the_older_commit_lacks_is_skipped(tmp_path):
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "engine_throughput.py").write_text("")
    names = ["engine_throughput", "cpu_batch_change"]
    assert regression.absent_benches(tmp_path, names) == ["cpu_batch_change"]
