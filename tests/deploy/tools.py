"""The deploy checks' outside tools (promtool, kubernetes-validate): skipped with the reason on a
developer's machine without them, a failure in CI (LORAPLEX_REQUIRE_SERVICES=1), which installs
them (.ci/run, requirements-dev.txt)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import NoReturn

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def tool_unavailable(message: str) -> NoReturn:
    if os.environ.get("LORAPLEX_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{message} (LORAPLEX_REQUIRE_SERVICES=1: the deploy checks must run)")
    pytest.skip(message)


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        tool_unavailable("promtool is not installed (Debian: apt-get install prometheus)")
    return path


def run_promtool(*args: str, cwd: Path) -> str:
    """promtool's output; a failure shows it whole."""
    done = subprocess.run(
        [promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    return output
