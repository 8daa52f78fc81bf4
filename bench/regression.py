"""This checkout's benchmarks against an older commit's, side by side in one session.

    .venv/bin/python bench/regression.py --against COMMIT [--bench NAME ...] [--rounds 2]

COMMIT is checked out as a git worktree in a temporary folder (removed after). For --rounds
rounds, each named bench (default: all of BENCHES) runs in this checkout and in that one,
alternately, which side goes first alternating too: the machine is shared, so load from
elsewhere falls on both alike. Both use this Python (the same venv) and share one
$LORAPLEX_VAR_DIR (the converted model and the bench adapters), each run from its own tree
with its own tree first on PYTHONPATH, so each imports its own code.

Each bench compares itself with a reference (transformers, PEFT) in its own run, or times
its own steps; its last line is one JSON object. Per bench, the median of each side's
headline figure over the rounds, and ours against theirs: the ratio of ratios
(ours / theirs) for a ratio, theirs / ours for seconds, so above 1 is better either way.
The last line is one JSON object of the figures.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from common import bench_parser

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Bench:
    script: str
    figures: tuple[str, ...]  # from its last-line JSON, the headline first
    higher_is_better: bool  # a ratio against a reference; else seconds


BENCHES = {
    "engine_throughput": Bench("engine_throughput.py", ("ratio",), True),
    "lora_mixed_batch": Bench("lora_mixed_batch.py", ("lora_vs_peft",), True),
    "cpu_batch_change": Bench(
        "cpu_batch_change.py", ("steady_step_s", "ttft_with_a_join_s", "leave_step_s"), False
    ),
}


def parse_args(argv: list[str] | None = None):
    parser = bench_parser(__doc__, rounds=2)
    parser.add_argument("--against", required=True, help="the older commit (any git revision)")
    parser.add_argument("--bench", action="append", choices=sorted(BENCHES), dest="benches")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    args.benches = list(dict.fromkeys(args.benches or BENCHES))  # in order, once each
    return args


def last_json(stdout: str) -> dict:
    """A bench's figures: the JSON object on its last non-empty line of output."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise ValueError("the bench printed nothing")
    figures = json.loads(lines[-1])
    if not isinstance(figures, dict):
        raise ValueError(f"the last line is not a JSON object: {lines[-1][:200]}")
    return figures


def ours_vs_theirs(ours: float, theirs: float, higher_is_better: bool) -> float:
    """Above 1 when ours is better: the ratio of ratios, or the inverse ratio of seconds."""
    return ours / theirs if higher_is_better else theirs / ours


def summarize(bench: Bench, ours: list[dict], theirs: list[dict]) -> dict:
    """Each figure's rounds and median on both sides, and ours against theirs (medians)."""
    summary = {}
    for name in bench.figures:
        mine, old = [r[name] for r in ours], [r[name] for r in theirs]
        ours_median, theirs_median = (round(statistics.median(x), 4) for x in (mine, old))
        summary[name] = {
            "ours": ours_median,
            "theirs": theirs_median,
            "ours_vs_theirs": round(
                ours_vs_theirs(ours_median, theirs_median, bench.higher_is_better), 3
            ),  # fmt: skip
            "ours_rounds": mine,
            "theirs_rounds": old,
        }
    return summary


def run_bench(tree: Path, bench: Bench, model: str | None, env: dict[str, str]) -> dict:
    """One run of a bench in `tree`, importing that tree's code; its last-line figures."""
    command = [sys.executable, str(tree / "bench" / bench.script)]
    if model is not None:
        command += ["--model", model]
    paths = [str(tree), *filter(None, [env.get("PYTHONPATH")])]
    done = subprocess.run(
        command,
        cwd=tree,
        env=env | {"PYTHONPATH": os.pathsep.join(paths)},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{bench.script} in {tree} failed:\n{done.stderr[-3000:]}")
    return last_json(done.stdout)


def absent_benches(tree: Path, names: list[str]) -> list[str]:
    """The named benches `tree` has no script for (newer than its commit)."""
    return [name for name in names if not (tree / "bench" / BENCHES[name].script).is_file()]


def worktree(commit: str, parent: Path) -> Path:
    path = parent / "against"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), commit],
                   check=True, capture_output=True, text=True)  # fmt: skip
    return path


def main():
    args = parse_args()
    env = dict(os.environ)
    env["LORAPLEX_VAR_DIR"] = env.get("LORAPLEX_VAR_DIR") or str(ROOT / "var")
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.against],
                            check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="regression-") as parent:
        theirs_tree = worktree(commit, Path(parent))
        try:
            absent = absent_benches(theirs_tree, args.benches)
            for name in absent:  # a bench newer than that commit: nothing to compare with
                print(f"{name}: not in {commit}, skipped", flush=True)
            args.benches = [name for name in args.benches if name not in absent]
            runs = {name: {"ours": [], "theirs": []} for name in args.benches}
            for r in range(args.rounds):
                for name in args.benches:
                    sides = [("ours", ROOT), ("theirs", theirs_tree)]
                    for side, tree in sides if r % 2 == 0 else sides[::-1]:
                        figures = run_bench(tree, BENCHES[name], args.model, env)
                        runs[name][side].append(figures)
                        print(f"round {r + 1} {name} {side}: {json.dumps(figures)}", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                            str(theirs_tree)], check=False, capture_output=True)  # fmt: skip
    report = {
        "against": commit,
        "rounds": args.rounds,
        "skipped": absent,
        "benches": {
            name: summarize(BENCHES[name], runs[name]["ours"], runs[name]["theirs"])
            for name in args.benches
        },
    }
    for name, summary in report["benches"].items():
        for figure, s in summary.items():
            print(f"{name} {figure}: ours {s['ours']}, {commit} {s['theirs']}, "
                  f"ours vs theirs {s['ours_vs_theirs']}x")  # fmt: skip
    print(json.dumps(report))


if __name__ == "__main__":
    main()
