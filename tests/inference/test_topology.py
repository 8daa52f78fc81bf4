"""The production topology, natively: separate web (engine off), worker and engine processes
on the configured database and broker, with S3 through moto's server.

One adapter travels the whole data flow: uploaded through the web replica's REST API,
validated by the worker reading S3, promoted, then served by the engine replica, which
stages it from S3 into its own adapter cache on first use (it hears of the promotion through
Redis, but prefetches only promotions of adapters it has served).
"""

import time
import uuid

import httpx
import pytest
from django.conf import settings

from tests.inference.conftest import start_server, stop_server
from tests.peft_adapters import make_peft_adapter
from tests.tiny_llama import make_tiny_llama

BASE = "tiny-topology"


@pytest.fixture
def s3_env(monkeypatch, tmp_path):
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    bucket = f"topology-{uuid.uuid4().hex[:8]}"
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_S3_ENDPOINT_URL": endpoint,
        "LORAPLEX_S3_BUCKET": bucket,
        "LORAPLEX_ADAPTER_CACHE_DIR": str(tmp_path / "worker-cache"),
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    yield env
    server.stop()


def test_upload_validate_promote_and_serve_across_processes(
    s3_env, live_worker, tmp_path, transactional_db
):
    from registry.services.base_models import base_model_import
    from tenants.services import api_key_create, tenant_create

    base_dir = make_tiny_llama(tmp_path / "base")
    adapter_dir = make_peft_adapter(
        base_dir, tmp_path / "adapter", rank=4, std=0.5, base_model_name=BASE
    )
    base_model_import(name=BASE, path=base_dir, default=True)
    tenant = tenant_create(slug="topology", name="Topology")
    _, key = api_key_create(
        tenant=tenant, name="all", scopes=["inference", "registry:read", "registry:write"]
    )
    auth = {"Authorization": f"Bearer {key}"}

    web, web_proc, _ = start_server(
        tmp_path, {"LORAPLEX_ENGINE": "off", "LORAPLEX_BASE_MODEL": BASE}
    )
    engine, engine_proc, engine_log = start_server(
        tmp_path,
        {"LORAPLEX_ADAPTER_CACHE_DIR": str(tmp_path / "engine-cache"), "LORAPLEX_BASE_MODEL": BASE},
    )
    try:
        assert httpx.get(f"{web}/readyz").json()["checks"] == ["broker", "database"]
        assert "engine" in httpx.get(f"{engine}/readyz").json()["checks"]
        created = httpx.post(f"{web}/api/v1/adapters/", json={"name": "bot"}, headers=auth)
        assert created.status_code == 201, created.text
        with (
            open(adapter_dir / "adapter_config.json", "rb") as c,
            open(adapter_dir / "adapter_model.safetensors", "rb") as w,
        ):
            uploaded = httpx.post(
                f"{web}/api/v1/adapters/bot/versions/",
                headers=auth,
                files={"config": c, "weights": w},
            )
        assert uploaded.status_code == 202, uploaded.text
        deadline = time.monotonic() + 90
        while (
            status := httpx.get(f"{web}/api/v1/adapters/bot/versions/1/", headers=auth).json()[
                "status"
            ]
        ) in ("pending", "validating"):
            assert time.monotonic() < deadline, "the worker never validated the upload"
            time.sleep(0.3)
        assert status == "ready"
        promoted = httpx.put(
            f"{web}/api/v1/adapters/bot/aliases/production/", json={"version": 1}, headers=auth
        )
        assert promoted.status_code in (200, 201), promoted.text

        cache = tmp_path / "engine-cache"
        if settings.REDIS_URL:  # it hears of the promotion, but prefetches only what it served
            deadline = time.monotonic() + 60
            while "not staging" not in engine_log.read_text():
                assert time.monotonic() < deadline, "the engine replica never heard of it"
                time.sleep(0.2)
        assert not cache.exists() or not any(cache.iterdir())  # staged on the first request
        body = {
            "model": "bot",
            "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 8,
            "temperature": 0,
        }
        answer = httpx.post(f"{engine}/v1/chat/completions", json=body, headers=auth, timeout=120)
        assert answer.status_code == 200, answer.text + engine_log.read_text()
        assert answer.json()["choices"][0]["message"]["content"]
        staged = list(cache.iterdir())
        assert len(staged) == 1  # fetched from S3 by the engine replica itself
        refused = httpx.post(f"{web}/v1/chat/completions", json=body, headers=auth)
        assert (
            refused.status_code == 503 and refused.json()["error"]["code"] == "engine_unavailable"
        )
    finally:
        stop_server(web_proc)
        stop_server(engine_proc)
