"""Runs the GPU suite's plan: each section in its own process under its cap, and one report
whatever happens.

A section that raises is an "error" with its exception, one that crashes (a fatal signal,
os._exit) an "error" naming the signal or the exit status, one still running at its cap a
"timeout"; each with the tail of its output. A section whose module is not there, whose cap
no longer fits in what the run has left, or whose input section did not end ok, is "skipped"
with the reason, and the run goes on to the next. Time a section leaves unused goes to the
next: each may run on to where the plan has it end at the latest (counted from the first
section's start), so a slow one is not cut while the run is ahead of its plan, and none
ever eats into the windows of the sections after it. SIGINT, SIGTERM or SIGHUP, from the first
import on, kills the running section ("interrupted"), skips the rest and still reports; so
does SIGALRM, the backstop armed for the end of the budget. The entries so far are written
to the shared folder before each section (later sections read their inputs there) and to
--out, if given, after each one, so even a run killed from outside leaves its figures.
"""

import json
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gpu_suite_plan import EARLIER_FILE, GRACE_S, REPORT_S, Section, cap_of, unavailable
from gpu_suite_process import SIGNALS, Child, signals_held, start
from gpu_suite_profile import Profile

Entry = dict[str, Any]
BACKSTOP_S = 1.0  # the alarm goes this long before the budget's end, leaving time to report


class Interrupted(BaseException):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Run:
    def __init__(self, *, sections: tuple[Section, ...], profile: Profile, workdir: Path,
                 budget_s: float, started: float, out: Path | None):  # fmt: skip
        self.sections = sections
        self.profile = profile
        self.workdir = workdir
        self.budget_s = budget_s
        self.started = started  # time.monotonic() when the suite's process began
        self.fork = True  # set by the preparation: False starts sections as new interpreters
        self.out = out
        self.entries: dict[str, Entry] = {}
        self.child: Child | None = None
        self.stop_reason: str | None = None
        self.signal: str | None = None  # SIGINT or SIGTERM, when one ended the run
        self.failure: str | None = None  # the suite's own error, if it had one
        self.guarded = False
        self.caught: int | None = None  # the signal the handler raised for, once it has
        self.extra: dict[str, Any] = {}  # start-up figures for the report
        self.first_start = 0.0  # time.monotonic() when the first section could start
        self.planned = 0.0  # the caps of the sections so far, the plan's end of the current

    def left(self) -> float:
        return self.budget_s - REPORT_S - (time.monotonic() - self.started)

    def run(self, prepare: Callable[["Run"], None] = lambda run: None) -> None:
        """`prepare` (the heavy imports) and every section, under the signal handlers and
        the budget's alarm; afterwards every section has an entry."""
        for signum in SIGNALS:  # kept to the end: a late signal must not lose the report
            signal.signal(signum, self._on_signal)
        self.guarded = True
        backstop = self.budget_s - BACKSTOP_S - (time.monotonic() - self.started)
        signal.setitimer(signal.ITIMER_REAL, max(backstop, 0.01))
        try:
            prepare(self)
            self._raise_if_swallowed()
            self.extra["startup_s"] = round(time.monotonic() - self.started, 2)
            self.first_start = time.monotonic()
            for section in self.sections:
                self._raise_if_swallowed()
                self.entries[section.name] = self._section(section)
                self._after(section.name)
                self.save(self.out)
        except Interrupted as interruption:
            self._stop(interruption.signum)
        except Exception as error:  # the suite's own fault: still a report
            self.guarded = False
            traceback.print_exc()
            self.failure = f"{type(error).__name__}: {error}"
            self.stop_reason = f"the suite failed: {self.failure}"
            self._kill_current("error")
        finally:
            self.guarded = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            for section in self.sections:
                if section.name not in self.entries:
                    self.entries[section.name] = {"status": "skipped", "reason": self.stop_reason}

    def _on_signal(self, signum: int, frame: object) -> None:
        if self.guarded:
            self.guarded = False  # a second signal must not interrupt the cleanup
            self.caught = signum
            raise Interrupted(signum)
        if signum != signal.SIGALRM:
            self.signal = self.signal or signal.Signals(signum).name

    def _raise_if_swallowed(self) -> None:
        """The handler's exception raised again: it can land in a library's bare `except`
        during the imports, which then carry on as if nothing happened."""
        if self.caught is not None:
            raise Interrupted(self.caught)

    def _stop(self, signum: int) -> None:
        if signum == signal.SIGALRM:
            self.stop_reason = "the suite's time budget ran out"
        else:
            self.signal = signal.Signals(signum).name
            self.stop_reason = f"the suite was interrupted by {self.signal}"
        self._kill_current("interrupted" if self.signal else "timeout")

    def _kill_current(self, status: str) -> None:
        """The running section (if one is) killed and recorded as `status`."""
        child, self.child = self.child, None
        current = next((s.name for s in self.sections if s.name not in self.entries), None)
        if child is None or current is None:
            return  # between sections, or still preparing: the rest are skipped
        child.kill(reap_s=BACKSTOP_S / 2)  # the report is due: no long wait for the reaping
        entry = {"status": status, "reason": self.stop_reason, "output_tail": child.tail_text()}
        if child.left_behind:
            entry["left_behind"] = f"process {child.pid} had not ended of SIGKILL yet"
        self.entries[current] = entry

    def _section(self, section: Section) -> Entry:
        cap = cap_of(section, self.profile.interpret)
        self.planned += cap
        if self.stop_reason:
            return {"status": "skipped", "reason": self.stop_reason}
        missing = unavailable(section)
        if missing:
            return {"status": "skipped", "reason": missing}
        for need in section.needs:
            status = self.entries.get(need, {}).get("status", "not in this run")
            if status != "ok":
                return {"status": "skipped", "reason": f"needs {need}, which is {status}"}
        left = self.left()
        if left < cap:
            return {"status": "skipped", "reason":
                    f"does not fit: its cap is {cap:.0f} s, {max(left, 0):.0f} s left"}  # fmt: skip
        (self.workdir / EARLIER_FILE).write_text(json.dumps(self.entries, default=str))
        result = self.workdir / f"{section.name}.result.json"
        began = time.monotonic()
        # its cap, or on to the plan's end of it when earlier sections left time; never
        # past the budget
        allowed = min(max(cap, self.first_start + self.planned - began), left)
        with signals_held():
            self.child = start(section.function, self.profile.name, self.workdir, result,
                               fork=self.fork)  # fmt: skip
        log(f"{section.name}: up to {allowed:.0f} s (process {self.child.pid})")
        exited = self.child.wait(began + allowed, grace=min(GRACE_S, allowed / 4))
        entry = self._outcome(self.child, exited, cap, allowed, result)
        entry["seconds"] = round(time.monotonic() - began, 2)
        entry["cap_s"] = cap
        entry["allowed_s"] = round(allowed, 1)
        if self.child.left_behind:
            entry["left_behind"] = f"process {self.child.pid} did not end of SIGKILL"
        self.entries[section.name] = entry  # before the child is let go: a signal may come
        self.child = None
        log(f"{section.name}: {entry['status']} in {entry['seconds']} s")
        return entry

    def _outcome(
        self, child: Child, exited: bool, cap: float, allowed: float, result: Path
    ) -> Entry:
        tail = child.tail_text()
        if not exited:
            error = f"killed at its cap of {cap:.0f} s"
            if allowed > cap + 0.5:
                error = (f"killed after {allowed:.0f} s: its cap of {cap:.0f} s and "
                         f"{allowed - cap:.0f} s earlier sections left")  # fmt: skip
            return {"status": "timeout", "error": error, "ended_by": child.ended_by,
                    "output_tail": tail}  # fmt: skip
        code = child.exit_code()
        if code == 0 and result.exists():
            try:
                figures = json.loads(result.read_text())
            except ValueError as error:
                return {"status": "error", "error": f"its figures are not JSON: {error}"}
            if not isinstance(figures, dict):
                return {"status": "error", "error": f"its figures are not an object: {figures!r}"}
            return {"status": "ok", **{k: v for k, v in figures.items() if k != "status"}}
        return {"status": "error", "error": crash_cause(code, tail), "exit_code": code,
                "output_tail": tail}  # fmt: skip

    def _after(self, name: str) -> None:
        entry = self.entries[name]
        no_device = entry["status"] == "ok" and not entry.get("cuda_available")
        if name == "environment" and not self.profile.interpret and no_device:
            self.stop_reason = "no CUDA device here"

    # -- the report ----------------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        return {
            "suite": "loraplex-gpu",
            "mode": "interpret" if self.profile.interpret else "cuda",
            "isolation": "fork" if self.fork else "exec",
            "budget_s": self.budget_s,
            "elapsed_s": round(time.monotonic() - self.started, 1),
            **self.extra,
            "interrupted_by": self.signal,
            "stopped": self.stop_reason,
            "suite_error": self.failure,
            "skipped": [n for n, e in self.entries.items() if e["status"] == "skipped"],
            "sections": self.entries,
            "goals": goals(self.entries, self.profile),
            "profile": asdict(self.profile),
        }

    def save(self, path: Path | None) -> None:
        if path is not None:
            partial = path.with_name(path.name + ".partial")
            partial.write_text(json.dumps(self.report(), indent=1, default=str) + "\n")
            partial.replace(path)


def crash_cause(code: int | None, tail: str) -> str:
    """Why a section ended without its figures, in one line: its exception, or the signal
    that killed it (with faulthandler's line saying which), or its exit status."""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        fatal = next((line for line in lines if line.startswith("Fatal Python error")), None)
        return f"killed by {name}" + (f" ({fatal})" if fatal else "")
    if code == 0:
        return "exited 0 without writing its figures"
    if code == 1 and lines:  # run_section printed the traceback
        return f"{lines[-1]} (exit 1)"
    return f"exit {code}" + (f": {lines[-1]}" if lines else ", no output")


def goals(entries: dict[str, Entry], profile: Profile) -> dict[str, Any]:
    """The pass/fail lines, None where their section did not finish."""

    def get(section: str, *keys: str) -> Any:
        value: Any = entries.get(section, {})
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        return value

    lora = get("lora_batch", "lora")
    base = {r["batch"]: r for r in get("decode_graphs", "rows") or [] if "error" not in r}
    over_base = None
    if lora and lora["batch"] in base:  # the base model on its own engine, LoRA off
        over_base = round(lora["tokens_per_s"] / base[lora["batch"]]["tokens_per_s"], 3)
    return {
        "kernels_match_reference": get("kernels", "match_reference"),
        "greedy_matches_transformers": get("correctness", "correct"),
        "lora_ratio_at_least_0_85": get("lora_batch", "meets_goal"),
        "lora_over_base_engine": over_base,
        "swap_p99_within_1_5x_plain_copy": get("lora_swap", "goal_within_1_5x"),
        "swap_p99_under_10_ms": get("lora_swap", "goal_under_10_ms"),
        "cuda_graphs_captured": get("decode_graphs", "graphs_captured"),
        # under --interpret the speed goals are read off a CPU: only the code ran
        "timings_meaningful": not profile.interpret,
    }


def log(message: str) -> None:
    print(f"[gpu_suite] {message}", file=sys.stderr, flush=True)
