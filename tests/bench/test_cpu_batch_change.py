"""bench/cpu_batch_change.py at tiny sizes: it runs end to end on the bundled SmolLM2, and
what it reports holds: a join copies the joining sequence's own tokens, a leave nothing,
and the reference gather of everyone copies more."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_benchmark_reports_a_join_copying_its_own_tokens_only():
    command = [sys.executable, str(ROOT / "bench" / "cpu_batch_change.py"), "--running", "2",
               "--system-tokens", "60", "--steady-steps", "1", "--kv-cache-mib", "64",
               "--reps", "1"]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["running"] == 2
    assert figures["join_copied_tokens"] == figures["join_own_tokens"] > 60
    assert figures["join_copy_bytes"] == figures["join_copied_bytes"]
    assert figures["leave_copied_tokens"] == 0
    assert figures["gather_all_sequences"] == 3  # at the join: the two running and it
    assert figures["gather_all_bytes"] > 3 * figures["join_copy_bytes"]
