"""`manage.py` commands in a fresh process, with the settings a test gives and none of the
environment's own Loraplex settings, database or secrets."""

import os
import subprocess
import sys

from tests.processes import ROOT

# Secrets long and unguessable enough for production's checks.
GOOD = {
    "SECRET_KEY": "x" * 20 + "-production-secret-for-the-check-0123456789",
    "LORAPLEX_OPERATOR_TOKEN": "operator-token-for-the-check-0123456789",
    "LORAPLEX_METRICS_TOKEN": "metrics-token-for-the-check-0123456789",
}


def manage(*args, env):
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DATABASE_URL", "SECRET_KEY", "LORAPLEX_", "DEBUG"))
    }
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
