"""SQLite, the embedded default, with a server and a worker process writing the same file.

Both processes read the production settings (DATABASE_URL=sqlite:///...): WAL, a busy
timeout and IMMEDIATE transactions, so a transaction that reads and then writes (the
version state machine, a key's creation) waits its turn instead of failing at once with
"database is locked". The test process only drives them; its own test transactions
begin DEFERRED (tests/conftest.py says why).
"""

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.processes import launch

ROOT = Path(__file__).resolve().parents[2]
SECONDS = 6

# The worker's side: the registry's pattern, a row read and then a change audited, in one
# transaction, as fast as it can for SECONDS.
WRITER = textwrap.dedent(
    """
    import json, sys, time
    import django
    django.setup()
    from django.db import OperationalError, transaction
    from audit.services import Subject, audit_record
    from tenants.models import Tenant

    deadline, writes, errors = time.monotonic() + float(sys.argv[1]), 0, []
    while time.monotonic() < deadline:
        try:
            with transaction.atomic():
                tenant = Tenant.objects.get(slug="sqlite-a")
                subject = Subject(tenant=tenant, type="test", name=f"write {writes}")
                audit_record(subject=subject, actor="system:worker", verb="test.write")
            writes += 1
        except OperationalError as exc:
            errors.append(str(exc))
    print(json.dumps({"writes": writes, "errors": errors[:3], "error_count": len(errors)}))
    """
)


def manage(env: dict, *args: str, **kwargs) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        **kwargs,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A migrated SQLite file with a tenant and a key that may create keys."""
    tmp = tmp_path_factory.mktemp("sqlite-site")
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp / 'site.sqlite3'}",
        "LORAPLEX_VAR_DIR": str(tmp / "var"),
        "LORAPLEX_ENGINE": "off",
        "DJANGO_SETTINGS_MODULE": "platform_site.settings",
    }
    env.pop("REDIS_URL", None)
    manage(env, "migrate", "--noinput")
    manage(env, "create_tenant", "sqlite-a")
    key = manage(env, "create_api_key", "sqlite-a", "--name", "w", "--scopes", "keys:write")
    return env, key.strip().splitlines()[-1], tmp


def test_the_embedded_database_is_configured_for_concurrent_processes(site):
    env, _, _ = site
    out = manage(
        env,
        "shell",
        "-c",
        "from django.db import connection\n"
        "c = connection.cursor()\n"
        "print(c.execute('PRAGMA journal_mode').fetchone()[0],"
        " c.execute('PRAGMA busy_timeout').fetchone()[0], connection.transaction_mode)",
    )
    assert out.strip().splitlines()[-1].split() == ["wal", "20000", "IMMEDIATE"]


def test_a_server_and_a_worker_write_at_once_without_database_is_locked(site):
    env, key, tmp = site
    url, server, log = launch(tmp, env, ready_path="/healthz", timeout=60)
    try:
        worker = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(SECONDS)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        statuses = []

        def create_keys():  # the server's side: each one reads, then writes key and audit
            with httpx.Client(
                base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60
            ) as client:
                stop = time.monotonic() + SECONDS
                while time.monotonic() < stop:
                    body = {"name": f"k{len(statuses)}", "scopes": ["keys:write"]}
                    statuses.append(client.post("/api/v1/keys/", json=body).status_code)

        threads = [threading.Thread(target=create_keys) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        out, err = worker.communicate(timeout=60)
        assert worker.returncode == 0, err
        report = json.loads(out.strip().splitlines()[-1])
    finally:
        server.terminate()
        server.wait(timeout=30)

    assert report["error_count"] == 0, report["errors"]
    assert report["writes"] > 10
    assert statuses and set(statuses) == {201}, (statuses.count(201), log.read_text()[-2000:])
    assert "database is locked" not in log.read_text()
