"""Settings come from the environment; production refuses to start unsafely."""

import multiprocessing
import os
from pathlib import Path

import pytest

from platform_site import secrets as secret_files
from tests.platform.commands import GOOD, manage

ROOT = Path(__file__).resolve().parents[2]


def test_production_passes_the_deploy_checks(tmp_path):
    env = {
        "LORAPLEX_ENV": "production",
        "LORAPLEX_VAR_DIR": str(tmp_path),
        **GOOD,
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
    code = (
        "from django.conf import settings; "
        "print(settings.SECRET_KEY, settings.DATABASES['default']['NAME'])"
    )
    outputs = [
        manage("shell", "-c", code, env={"LORAPLEX_VAR_DIR": str(tmp_path / d)}).stdout
        for d in "aab"
    ]
    assert outputs[0] == outputs[1] != outputs[2]
    assert str(tmp_path / "a") in outputs[0]
    assert (tmp_path / "a" / "secret_key").stat().st_mode & 0o777 == 0o600


DEBUG_IS = "from django.conf import settings; print('DEBUG', settings.DEBUG)"


@pytest.mark.parametrize(
    "value, expected", [(None, "DEBUG False"), ("1", "DEBUG True"), ("0", "DEBUG False")]
)
def test_debug_is_opt_in(tmp_path, value, expected):
    """Was on by default outside production: any 500 showed settings and a traceback."""
    env = {"LORAPLEX_VAR_DIR": str(tmp_path)} | ({"DEBUG": value} if value else {})
    result = manage("shell", "-c", DEBUG_IS, env=env)
    assert expected in result.stdout, result.stderr


def test_the_secret_key_file_is_never_readable_by_others(tmp_path, monkeypatch):
    """Created 0600 with O_EXCL from the first byte on, whatever the umask: no window in which
    another user could read it (writing it first and chmod-ing after left one)."""
    created = []
    real_open = os.open

    def spy(path, flags, mode=0o777, *args, **kwargs):
        if flags & os.O_CREAT:
            created.append((Path(path).parent, flags, mode))
        return real_open(path, flags, mode, *args, **kwargs)

    monkeypatch.setattr(secret_files.os, "open", spy)
    old_umask = os.umask(0)  # the most permissive: the mode alone must keep others out
    try:
        key = secret_files.development_secret_key(tmp_path / "var")
    finally:
        os.umask(old_umask)
    assert created, "the file is created with os.open(..., 0o600)"
    for folder, flags, mode in created:
        assert folder == tmp_path / "var"
        assert flags & os.O_EXCL and mode & 0o077 == 0, (oct(flags), oct(mode))
    path = tmp_path / "var" / "secret_key"
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.read_text() == key and len(key) >= 50
    assert [p.name for p in (tmp_path / "var").iterdir()] == ["secret_key"]  # no leftovers


def _read_key(var_dir: str, start, out) -> None:
    start.wait()
    out.put(secret_files.development_secret_key(Path(var_dir)))


def test_processes_starting_together_agree_on_one_key(tmp_path):
    ctx = multiprocessing.get_context("fork")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_read_key, args=(str(tmp_path), start, out)) for _ in range(6)]
    for proc in procs:
        proc.start()
    start.set()
    keys = {out.get(timeout=30) for _ in procs}
    for proc in procs:
        proc.join(timeout=30)
    assert len(keys) == 1
