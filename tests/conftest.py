"""Shared fixtures, healthchecks style: alice owns tenant A, bob is a member of A, charlie owns B.

Isolation is cheap to test everywhere because these three always exist.
"""

import os

# Triton kernels run on the CPU only under the interpreter, and the variable must be set
# before any module defining @triton.jit kernels is imported: here, before every test module.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
from rest_framework.test import APIClient

from tenants.scopes import ALL_SCOPES, MEMBER
from tenants.services import api_key_create, membership_set, tenant_create, user_get_or_create


def pytest_report_header(config):
    """The CPU and torch's kernel choice on it, atop every run: fp32 parity results differ
    in their last bits between instruction sets."""
    from tests.cpu_description import cpu_description  # torch: only once a session starts

    return f"cpu: {cpu_description()}"


@pytest.fixture(scope="session", autouse=True)
def sqlite_test_transactions_begin_deferred():
    """On SQLite, the one transaction wrapping a `django_db` test begins DEFERRED.

    Production begins every transaction IMMEDIATE (platform_site/settings.py), and so does
    the code under test here; but the wrapping transaction lasts the whole test, and begun
    IMMEDIATE it would hold SQLite's write lock throughout: the live servers and workers
    the test starts could not write. Nothing in production holds a transaction that long.
    """
    import threading

    from django.db.backends.sqlite3.base import DatabaseWrapper
    from django.test import TestCase

    wrapping = threading.local()
    enter_atomics = TestCase.__dict__["_enter_atomics"].__func__
    start_transaction = DatabaseWrapper._start_transaction_under_autocommit

    def enter_test_atomics(cls):
        wrapping.active = True
        try:
            return enter_atomics(cls)
        finally:
            wrapping.active = False

    def start(self):
        if getattr(wrapping, "active", False):
            self.cursor().execute("BEGIN")
        else:
            start_transaction(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(TestCase, "_enter_atomics", classmethod(enter_test_atomics))
        patch.setattr(DatabaseWrapper, "_start_transaction_under_autocommit", start)
        yield


@pytest.fixture
def private_redis(tmp_path):
    """A Redis of the test's own (broker, cache): killing or restarting it touches no one else."""
    from tests.faults.services import RedisServer

    server = RedisServer(tmp_path).start()
    yield server
    server.stop()


@pytest.fixture
def alice(db):
    return user_get_or_create(email="alice@example.com", password="alice-password-1")


@pytest.fixture
def bob(db):
    return user_get_or_create(email="bob@example.com", password="bob-password-1")


@pytest.fixture
def charlie(db):
    return user_get_or_create(email="charlie@example.com", password="charlie-password-1")


@pytest.fixture
def tenant_a(alice, bob):
    tenant = tenant_create(slug="tenant-a", name="Tenant A", owner=alice)
    membership_set(tenant=tenant, user=bob, role=MEMBER)
    return tenant


@pytest.fixture
def tenant_b(charlie):
    return tenant_create(slug="tenant-b", name="Tenant B", owner=charlie)


@pytest.fixture
def make_key():
    """make_key(tenant, scopes=...) -> (ApiKey, full key text)."""

    def make(tenant, scopes=ALL_SCOPES, **kwargs):
        return api_key_create(
            tenant=tenant, name=kwargs.pop("name", "test"), scopes=list(scopes), **kwargs
        )

    return make


@pytest.fixture
def key_client():
    """key_client(full_key) -> an APIClient that sends it as a Bearer token."""

    def make(full_key):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {full_key}")
        return client

    return make


def signed_in_clients(client_class):
    """make(user) -> a `client_class` test client with that user's session."""

    def make(user):
        client = client_class()
        client.force_login(user)
        return client

    return make


@pytest.fixture
def user_client():
    """user_client(user) -> an APIClient signed in as that user (session auth)."""
    return signed_in_clients(APIClient)


@pytest.fixture
def live_worker(transactional_db, tmp_path):
    """A real `celery -A platform_site worker` process on the configured broker and test database.

    Tests that use it must commit their data (transactional_db) so the worker can read it.
    """
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    from django.db import connection

    from platform_site.tasks import ping

    env = dict(os.environ)
    db = connection.settings_dict
    if connection.vendor == "postgresql":
        env["DATABASE_URL"] = (
            f"postgres://{db['USER']}:{db['PASSWORD'] or ''}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
        )
    else:
        env["DATABASE_URL"] = f"sqlite:///{db['NAME']}"
    log = tmp_path / "worker.log"
    root = Path(__file__).resolve().parents[1]
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "platform_site",
                "worker",
                "-P",
                "solo",
                "-l",
                "INFO",
                "--without-heartbeat",
                "--without-gossip",
                "--without-mingle",
                "-n",
                f"test-{os.getpid()}@%h",
            ],
            cwd=root,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while True:  # ready when it answers a ping through the broker
            try:
                ping.apply_async().get(timeout=5)
                break
            except Exception:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"worker did not start:\n{log.read_text()}") from None
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
