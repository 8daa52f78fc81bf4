"""One GPU suite section, run in the process it is given: the section's figures are written
as JSON to a result file, and what goes wrong goes to stderr (the parent keeps its tail).

A crash names its place: faulthandler prints every thread's Python stack on a fatal signal
(SIGSEGV, SIGABRT, ...) and on the SIGTERM the suite sends at a section's cap, even from
inside a C call. The section dies with the suite: if the suite's process is killed outright,
the kernel sends the section SIGKILL.

A forked child calls `run_section`; where forking is unsafe the parent starts this file as
a script instead, paying the imports again:

    python bench/gpu_suite_child.py MODULE:FUNCTION PROFILE WORKDIR RESULT SUITE_PID
"""

import ctypes
import faulthandler
import importlib
import json
import os
import signal
import sys
import traceback
from pathlib import Path

PR_SET_PDEATHSIG = 1


def die_with(parent: int) -> None:
    """SIGKILL this process when `parent` ends (Linux; elsewhere nothing happens)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it ended before the request took effect
        os._exit(1)


def run_section(function: str, profile: str, workdir: Path, result: Path) -> int:
    """The exit status: 0 once the figures are written, 1 if the section raised."""
    faulthandler.enable(all_threads=True)
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
    try:
        from gpu_suite_context import Context
        from gpu_suite_profile import PROFILES

        module, name = function.split(":")
        section = getattr(importlib.import_module(module), name)
        figures = section(Context(PROFILES[profile], workdir))
        partial = result.with_name(result.name + ".partial")
        partial.write_text(json.dumps(figures, default=str))
        partial.replace(result)
        return 0
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def main() -> None:
    function, profile, workdir, result, parent = sys.argv[1:6]
    die_with(int(parent))
    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here), str(here.parent)]
    code = run_section(function, profile, Path(workdir), Path(result))
    os._exit(code)  # no waiting on threads an engine may have left running


if __name__ == "__main__":
    main()
