"""Runs the GPU suite's sections under one time budget: each section gets a cap (its own,
cut to what the whole run has left), and whatever it raises or however it overruns is
written into its entry, so one broken section never hides the figures of the others.

A cap is enforced with SIGALRM: the section's Python code is interrupted at its next
bytecode. A device kernel already queued still finishes, and an interrupted section may
leave its engine half-stepped, so sections build what they need and keep nothing that a
later section would trust blindly.
"""

import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

Figures = dict[str, Any]


class SectionTimeout(BaseException):
    """Raised inside a section when its cap is spent (a BaseException, so no `except
    Exception` in the code under test swallows it)."""


def _on_alarm(signum: int, frame: object) -> None:
    raise SectionTimeout


class Budget:
    """The run's time budget, in seconds from creation, and the entries of the sections so far."""

    def __init__(self, total_s: float, reserve_s: float = 5.0):
        self.start = time.monotonic()
        self.total_s = total_s
        self.reserve_s = reserve_s  # kept back for printing the JSON after the last section
        self.sections: dict[str, Figures] = {}

    def left(self) -> float:
        return self.total_s - self.reserve_s - (time.monotonic() - self.start)

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def run(self, name: str, cap_s: float, section: Callable[[], Figures]) -> Figures:
        """Run `section`; its entry is its figures plus "status" (ok, error, timeout or
        skipped) and "seconds", and "error" with what went wrong."""
        cap = min(cap_s, self.left())
        if cap < 1:
            entry: Figures = {"status": "skipped", "error": "the suite's time budget is spent"}
            self.sections[name] = entry
            return entry
        print(f"[gpu_suite] {name}: up to {cap:.0f} s", file=sys.stderr, flush=True)
        start = time.monotonic()
        previous = signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, cap)
        try:
            entry = {"status": "ok", **section()}
        except SectionTimeout:
            entry = {"status": "timeout", "error": f"cut at its cap of {cap:.0f} s"}
        except Exception as error:  # recorded, so the next sections still run
            traceback.print_exc(file=sys.stderr)
            entry = {"status": "error", "error": f"{type(error).__name__}: {error}"[:2000]}
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        entry["seconds"] = round(time.monotonic() - start, 2)
        self.sections[name] = entry
        print(f"[gpu_suite] {name}: {entry['status']} in {entry['seconds']} s", file=sys.stderr)
        return entry


class Needs(Exception):
    """A section cannot run because one it depends on failed or did not run."""

    def __init__(self, section: str, budget: Budget):
        status = budget.sections.get(section, {}).get("status", "not run")
        super().__init__(f"needs section {section!r}, which is {status}")
