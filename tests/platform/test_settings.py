"""Settings come from the environment; production refuses to start unsafely."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def manage(*args, env):
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DATABASE_URL", "SECRET_KEY", "LORAPLEX_"))
    }
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_production_passes_the_deploy_checks(tmp_path):
    env = {
        "LORAPLEX_ENV": "production",
        "LORAPLEX_VAR_DIR": str(tmp_path),
        "SECRET_KEY": "x" * 20 + "-production-secret-for-the-check-0123456789",
        "ALLOWED_HOSTS": "loraplex.example.com",
    }
    result = manage("check", "--deploy", "--fail-level", "WARNING", env=env)
    assert result.returncode == 0, result.stdout + result.stderr


def test_production_without_secret_key_refuses_to_start(tmp_path):
    env = {"LORAPLEX_ENV": "production", "LORAPLEX_VAR_DIR": str(tmp_path), "ALLOWED_HOSTS": "x"}
    result = manage("check", env=env)
    assert result.returncode != 0
    assert "SECRET_KEY" in result.stderr


def test_development_generates_one_secret_per_var_dir(tmp_path):
    code = "from django.conf import settings; print(settings.SECRET_KEY, settings.DATABASES['default']['NAME'])"
    outputs = [
        manage("shell", "-c", code, env={"LORAPLEX_VAR_DIR": str(tmp_path / d)}).stdout
        for d in "aab"
    ]
    assert outputs[0] == outputs[1] != outputs[2]
    assert str(tmp_path / "a") in outputs[0]
    assert (tmp_path / "a" / "secret_key").stat().st_mode & 0o777 == 0o600
