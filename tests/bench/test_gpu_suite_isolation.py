"""The GPU suite cannot overrun: a section that hangs (signals blocked, a child of its own
started) is killed with its process group at its cap, one stuck in a C call gets SIGTERM
first and says where it was, one that crashes is an error naming the signal or the exit
status, and the rest still run. A section that does not fit in what is left, or whose
module is not there, is skipped by name. SIGTERM or SIGINT to the suite, even during its
imports, kills the running section and still prints the report; a suite killed outright
takes its section with it.

The suite's own main drives sections written here; they run in GPU mode's caps (no
--interpret), which they never reach but the hanging ones."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECTIONS_MODULE = """
import ctypes, os, signal, subprocess, sys, time

def hangs(ctx):
    sleeper = subprocess.Popen(["sleep", "600"])
    print(f"grandchild {sleeper.pid}", file=sys.stderr, flush=True)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    time.sleep(600)

def stuck_in_c(ctx):
    ctypes.CDLL(None).sleep(600)

def segfaults(ctx):
    ctypes.string_at(0)

def exits(ctx):
    print("bye", flush=True)
    os._exit(3)

def crashes(ctx):
    raise RuntimeError("the device fell over")

def quick(ctx):
    return {"answer": 42}
"""
SLOW_IMPORT = """
import sys, time
print("importing", file=sys.stderr, flush=True)
time.sleep(600)
"""
DRIVER = f"""
import json, os, sys
sys.path[:0] = [{str(ROOT / "bench")!r}]
import gpu_suite
from gpu_suite_plan import Section

SECTIONS = tuple(Section(name, cap, function, tuple(needs))
                 for name, cap, function, needs in json.loads(os.environ["SECTIONS"]))
gpu_suite.main(sys.argv[1:], SECTIONS, preloaded=tuple(json.loads(os.environ["PRELOAD"])))
"""
HANGS = [["hangs", 300, "hangs", []], ["needs_hangs", 30, "quick", ["hangs"]],
         ["crashes", 30, "crashes", []], ["after", 30, "quick", []]]  # fmt: skip


def here(*sections: list) -> list:
    """Sections of the module written here, by function name."""
    return [
        [name, cap, f"sections_here:{function}", needs] for name, cap, function, needs in sections
    ]


def driver(tmp_path: Path, sections: list, *args: str, preload: tuple[str, ...] = ()):
    """The suite's main over sections of this file's module, as its own process."""
    (tmp_path / "sections_here.py").write_text(SECTIONS_MODULE)
    (tmp_path / "slow_import.py").write_text(SLOW_IMPORT)
    (tmp_path / "driver.py").write_text(DRIVER)
    return subprocess.Popen(
        [sys.executable, str(tmp_path / "driver.py"), "--workdir", str(tmp_path), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, SECTIONS=json.dumps(sections), PRELOAD=json.dumps(preload)),
    )


def finish(process: subprocess.Popen[str]) -> tuple[dict, str]:
    stdout, stderr = process.communicate(timeout=120)
    return json.loads(stdout.strip().splitlines()[-1]), stderr


def read_until(process: subprocess.Popen[str], *needles: str) -> str:
    """Its stderr up to the line where every needle has been seen."""
    assert process.stderr is not None
    seen: list[str] = []
    for line in process.stderr:
        seen.append(line)
        if all(any(n in s for s in seen) for n in needles):
            break
    return "".join(seen)


def grandchild(output: str) -> int:
    return int(next(line for line in output.splitlines() if "grandchild" in line).split()[-1])


def gone(pid: int) -> bool:
    """Not running: no such process, or a zombie waiting for whoever inherited it."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return True
    return fields[0] in ("Z", "X")


@pytest.mark.parametrize("isolation", ["fork", "exec"])
def test_hangs_and_crashes_are_ended_and_named_and_the_rest_still_run(tmp_path, isolation):
    sections = [["hangs", 2, "hangs", []], ["stuck_in_c", 2, "stuck_in_c", []],
                ["needs_hangs", 30, "quick", ["hangs"]], ["segfaults", 30, "segfaults", []],
                ["exits", 30, "exits", []], ["crashes", 30, "crashes", []],
                ["after", 30, "quick", []]]  # fmt: skip
    process = driver(tmp_path, here(*sections), "--isolation", isolation)
    report, stderr = finish(process)
    assert process.returncode == 0, stderr[-4000:]
    assert report["isolation"] == isolation
    got = report["sections"]
    assert list(got) == [s[0] for s in sections]
    # signals blocked: SIGTERM does nothing, SIGKILL at the cap ends it and its child
    assert got["hangs"]["status"] == "timeout", got["hangs"]
    assert got["hangs"]["error"] == "killed at its cap of 2 s"
    assert got["hangs"]["ended_by"] == "SIGKILL"
    assert gone(grandchild(stderr))
    assert got["needs_hangs"] == {"status": "skipped", "reason": "needs hangs, which is timeout"}
    # in a C call: the SIGTERM before the cap ends it, with its Python stack
    assert got["stuck_in_c"]["status"] == "timeout", got["stuck_in_c"]
    assert got["stuck_in_c"]["ended_by"] == "SIGTERM"
    assert "in stuck_in_c" in got["stuck_in_c"]["output_tail"]
    assert got["segfaults"]["status"] == "error"
    assert got["segfaults"]["error"] == "killed by SIGSEGV (Fatal Python error: Segmentation fault)"
    assert "in segfaults" in got["segfaults"]["output_tail"]
    assert got["exits"]["error"] == "exit 3: bye"
    assert got["crashes"]["status"] == "error"
    assert got["crashes"]["error"] == "RuntimeError: the device fell over (exit 1)"
    assert "Traceback" in got["crashes"]["output_tail"]
    assert got["after"]["status"] == "ok" and got["after"]["answer"] == 42
    assert report["skipped"] == ["needs_hangs"]


def test_what_does_not_fit_or_is_not_there_is_skipped_by_name_and_the_rest_run(tmp_path):
    sections = here(["too_big", 300, "quick", []], ["small", 2, "quick", []])
    sections.insert(1, ["not_written", 2, "not_written_yet:quick", []])
    process = driver(tmp_path, sections, "--budget", "20")
    report, stderr = finish(process)
    assert process.returncode == 0, stderr[-4000:]
    got = report["sections"]
    assert got["too_big"]["status"] == "skipped"
    assert got["too_big"]["reason"].startswith("does not fit: its cap is 300 s, ")
    reason = "not available: no module named not_written_yet"
    assert got["not_written"] == {"status": "skipped", "reason": reason}
    assert got["small"]["status"] == "ok" and got["small"]["answer"] == 42
    # the time the skipped ones did not use is the next one's, up to what the budget has left
    assert got["small"]["cap_s"] == 2 < got["small"]["allowed_s"] <= 20
    assert report["skipped"] == ["too_big", "not_written"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_kills_the_running_section_and_still_reports(tmp_path, signum):
    out = tmp_path / "report.json"
    process = driver(tmp_path, here(*HANGS), "--out", str(out))
    seen = read_until(process, "grandchild")  # the hanging section has started its child
    process.send_signal(signum)
    report, stderr = finish(process)
    assert process.returncode == 128 + signum, stderr[-4000:]
    name = signal.Signals(signum).name
    assert report["interrupted_by"] == name
    got = report["sections"]
    assert got["hangs"]["status"] == "interrupted"
    assert got["hangs"]["reason"] == f"the suite was interrupted by {name}"
    assert report["skipped"] == ["needs_hangs", "crashes", "after"]
    assert got["after"]["reason"] == f"the suite was interrupted by {name}"
    assert gone(grandchild(seen))
    assert json.loads(out.read_text())["sections"] == got


def test_sigterm_during_the_imports_still_reports_every_section_skipped(tmp_path):
    process = driver(tmp_path, here(*HANGS), preload=("slow_import",))
    read_until(process, "importing")
    process.send_signal(signal.SIGTERM)
    report, stderr = finish(process)
    assert process.returncode == 128 + signal.SIGTERM, stderr[-4000:]
    assert report["skipped"] == [s[0] for s in HANGS]
    reasons = {e["reason"] for e in report["sections"].values()}
    assert reasons == {"the suite was interrupted by SIGTERM"}


def test_the_budget_alarm_ends_imports_that_never_finish(tmp_path):
    process = driver(tmp_path, here(*HANGS), "--budget", "3", preload=("slow_import",))
    report, stderr = finish(process)
    assert process.returncode == 0, stderr[-4000:]
    assert report["stopped"] == "the suite's time budget ran out"
    assert report["skipped"] == [s[0] for s in HANGS]
    assert report["elapsed_s"] < report["budget_s"] == 3


def test_a_suite_killed_outright_takes_its_running_section_with_it(tmp_path):
    process = driver(tmp_path, here(*HANGS))
    seen = read_until(process, "grandchild", "hangs: up to")
    section = int(next(line for line in seen.splitlines() if "hangs: up to" in line)
                  .rsplit("process ", 1)[1].rstrip(")"))  # fmt: skip
    process.kill()
    process.wait(timeout=60)
    try:
        deadline = time.monotonic() + 60
        while not gone(section) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gone(section)
    finally:  # the section's own child outlives it; it was started here, so ended here
        if not gone(grandchild(seen)):
            os.kill(grandchild(seen), signal.SIGKILL)
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()
