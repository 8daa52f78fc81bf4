"""PostgreSQL stopped and started again under traffic, with a live `serve` on a private cluster.

Requests that need the database while it is down fail (and the server stays up);
requests after it is back succeed from the first one, and every request that was
answered is metered, including those that finished while the database was down.
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
import psycopg
import pytest

from tenants.key_cache import KEY_CACHE_SECONDS
from tests.clients import chat, chat_stream, http
from tests.faults.services import PostgresServer
from tests.inference.conftest import start_server, stop_server
from tests.peft_adapters import make_peft_adapter
from tests.tiny_llama import make_tiny_llama
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
BASE = "tiny-pg"

SETUP = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import django
    django.setup()
    from registry.services.adapters import adapter_create
    from registry.services.aliases import alias_set
    from registry.services.base_models import base_model_import
    from registry.services.versions import adapter_version_create, adapter_version_validate
    from tenants.services import api_key_create, tenant_create

    base_dir, adapter_dir = Path(sys.argv[1]), Path(sys.argv[2])
    base_model_import(name="tiny-pg", path=base_dir, default=True)
    tenant = tenant_create(slug="pg-a")
    _, key = api_key_create(tenant=tenant, name="pg", scopes=["inference", "registry:read"])
    adapter = adapter_create(tenant=tenant, name="pirate", actor="test")
    with open(adapter_dir / "adapter_config.json", "rb") as c, open(
        adapter_dir / "adapter_model.safetensors", "rb"
    ) as w:
        version, _ = adapter_version_create(adapter=adapter, config=c, weights=w, actor="test")
    version = adapter_version_validate(version_id=version.pk)
    assert version.status == "ready", version.report
    alias_set(adapter=adapter, name="production", version_number=version.number, actor="test")
    print(json.dumps({"key": key}))
    """
)


@pytest.fixture(scope="module")
def cluster():
    server = PostgresServer().init()
    server.start()
    yield server
    server.destroy()


@pytest.fixture(scope="module")
def site(cluster, tmp_path_factory):
    """A migrated database on the private cluster, a tiny base model and one ready adapter."""
    tmp = tmp_path_factory.mktemp("pg-site")
    base_dir = make_tiny_llama(tmp / "base")
    adapter_dir = make_peft_adapter(base_dir, tmp / "adapter", rank=4, base_model_name=BASE)
    with psycopg.connect(cluster.url, autocommit=True) as connection:
        connection.execute("CREATE DATABASE loraplex")
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "CELERY_BROKER_URL")},
        "DATABASE_URL": cluster.url.rsplit("/", 1)[0] + "/loraplex",
        "LORAPLEX_VAR_DIR": str(tmp / "var"),
    }
    for args in (
        ["manage.py", "migrate", "--noinput"],
        ["-c", SETUP, str(base_dir), str(adapter_dir)],
    ):
        done = subprocess.run(
            [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stdout + done.stderr
    key = json.loads(done.stdout.strip().splitlines()[-1])["key"]
    return env, key, tmp


def stream_after_first_chunk(url: str, key: str, started: threading.Event, out: list) -> None:
    """A long streamed answer: signals once it is running, then reads it to the end."""
    with chat_stream(url, key, model=BASE, max_tokens=120) as response:
        lines = response.iter_lines()
        for line in lines:
            if line.startswith("data: "):
                started.set()
                break
        rest = [line for line in lines if line]
    out.append((response.status_code, rest[-1] if rest else ""))


def metered(url: str, key: str) -> int:
    response = http(url, "GET", "/api/v1/usage/", key=key)
    assert response.status_code == 200, response.text
    return sum(row["requests"] for row in response.json()["data"])


def test_requests_after_a_database_restart_succeed_and_no_usage_is_lost(site, cluster):
    env, key, tmp = site
    # Connections are kept between requests here (CONN_MAX_AGE): the case that needs the
    # health check, as the usage writer's and adapter loaders' long-lived threads do.
    url, proc, log = start_server(
        tmp,
        {
            "DATABASE_URL": env["DATABASE_URL"],
            "LORAPLEX_VAR_DIR": env["LORAPLEX_VAR_DIR"],
            "LORAPLEX_BASE_MODEL": BASE,
            "CONN_MAX_AGE": "60",
        },
    )
    try:
        answered = 0
        for model in (BASE, "pirate"):
            assert chat(url, key, model=model).status_code == 200
            answered += 1
        wait_for(lambda: metered(url, key) == answered, what="the first records")

        # Three long answers are running when the database goes away.
        streams = []
        started = [threading.Event() for _ in range(3)]
        threads = [
            threading.Thread(target=stream_after_first_chunk, args=(url, key, s, streams))
            for s in started
        ]
        for thread in threads:
            thread.start()
        for event in started:
            assert event.wait(60)
        cluster.stop()
        for thread in threads:
            thread.join(60)
        assert [s for s, last in streams] == [200] * 3
        assert all(last == "data: [DONE]" for s, last in streams), streams
        answered += 3
        # A key verified within the last second is trusted without the database
        # (tenants/key_cache.py); once that second is up, it needs the database to
        # authenticate: refused, not hung.
        time.sleep(KEY_CACHE_SECONDS)
        down = chat(url, key, model=BASE)
        assert down.status_code >= 500
        time.sleep(2.5)  # the usage writer tries (and fails) to write the three records

        cluster.start()
        assert proc.poll() is None, "the server must outlive its database"
        for model in (BASE, "pirate", BASE):  # from the first request on
            response = chat(url, key, model=model)
            assert response.status_code == 200, response.text
            answered += 1
        assert httpx.get(f"{url}/readyz", timeout=10).status_code == 200
        wait_for(lambda: metered(url, key) == answered, what="every answer metered")
    finally:
        stop_server(proc)
    assert "they are lost" not in log.read_text()
