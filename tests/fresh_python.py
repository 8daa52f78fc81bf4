"""Run a script in a fresh Python process at the repository root: for what only a clean
process shows (which modules an import pulls in, settings read when a module loads)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_python(
    script: str, *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """`python -c script args...` with the repository importable; `env` (default: this
    process's environment) is the child's environment besides PYTHONPATH."""
    child_env = {**(os.environ if env is None else env), "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=ROOT,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def modules_after(script: str, env: dict[str, str] | None = None) -> set[str]:
    """The top-level packages a fresh interpreter holds after running `script`."""
    report = "\nimport sys\nprint(' '.join(sorted({m.split('.')[0] for m in sys.modules})))\n"
    result = run_python(script + report, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    return set(result.stdout.splitlines()[-1].split())
