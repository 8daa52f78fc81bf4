"""Rows shared by the replica tests: a tenant with a key, a tiny base model, and adapters.

`serve` replicas are separate processes on the test database (committed rows), sharing
Redis and the object store as a deployment's replicas do; each test starts its own
replicas (and HAProxy) and stops them. Slugs are unique to this package.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.inference.conftest import drop_live_rows, start_server
from tests.peft_adapters import make_peft_adapter
from tests.tiny_llama import make_tiny_llama

BASE_NAME = "tiny-replicas"
TENANT = "replicas-a"
ADAPTERS = 12
OPERATOR_TOKEN = "replicas-operator-token"
KEY_PREFIX = "a11ce0000001"  # the router hashes the key's prefix: chosen, as the names are
TARGETS = ("q_proj", "v_proj", "o_proj")


@dataclass
class ReplicaData:
    tmp: Path
    base_dir: Path
    key: str
    adapters: list[str]  # model names, each with one ready version


def make_adapter(base_dir: Path, out: Path, *, seed: int, base_name: str) -> Path:
    return make_peft_adapter(
        base_dir, out, rank=4, alpha=8, targets=TARGETS, seed=seed, std=0.2,
        base_model_name=base_name,
    )  # fmt: skip


def upload_ready(adapter, folder: Path):
    """One version from `folder`, validated in this process: ready, or the test fails."""
    from registry.services.versions import adapter_version_create, adapter_version_validate

    with (
        open(folder / "adapter_config.json", "rb") as c,
        open(folder / "adapter_model.safetensors", "rb") as w,
    ):
        version, _ = adapter_version_create(adapter=adapter, config=c, weights=w, actor="test")
    ready = adapter_version_validate(version_id=version.pk)
    assert ready is not None and ready.status == "ready", version.report
    return ready


def api_key_with_prefix(tenant, prefix: str) -> str:
    """A key whose public prefix is `prefix`: the router's affinity key includes it, so a
    test's placement of adapters on replicas is the same on every run."""
    from unittest import mock

    from tenants import keys
    from tenants.services import api_key_create

    chosen = keys.NewKey(prefix=prefix, secret=secrets.token_urlsafe(32))
    with mock.patch.object(keys, "generate_key", return_value=chosen):
        _, key = api_key_create(tenant=tenant, name=prefix, scopes=["inference", "registry:read"])
    return key


@pytest.fixture(scope="module")
def replica_data(django_db_setup, django_db_blocker, tmp_path_factory):
    from registry.models import BaseModel
    from registry.services.adapters import adapter_create
    from registry.services.base_models import base_model_import
    from tenants.services import tenant_create

    tmp = tmp_path_factory.mktemp("replicas")
    base_dir = make_tiny_llama(tmp / "base")
    names = [f"r{i:02d}" for i in range(ADAPTERS)]
    with django_db_blocker.unblock():
        served = list(BaseModel.objects.filter(is_default=True).values_list("pk", flat=True))
        base, _ = base_model_import(name=BASE_NAME, path=base_dir, default=True)
        tenant = tenant_create(slug=TENANT, name="Replicas A")
        key = api_key_with_prefix(tenant, KEY_PREFIX)
        for i, name in enumerate(names):
            folder = make_adapter(base_dir, tmp / name, seed=i, base_name=BASE_NAME)
            upload_ready(adapter_create(tenant=tenant, name=name, actor="test"), folder)
    yield ReplicaData(tmp=tmp, base_dir=base_dir, key=key, adapters=names)
    with django_db_blocker.unblock():
        drop_live_rows([TENANT], base, previously_default=served)


def replica_env(data: ReplicaData, name: str, **extra: str) -> dict[str, str]:
    """One replica's settings: its own adapter cache folder, the shared everything else."""
    return {
        "LORAPLEX_BASE_MODEL": BASE_NAME,
        "LORAPLEX_ADAPTER_CACHE_DIR": str(data.tmp / f"cache-{name}"),
        "LORAPLEX_MAX_LORAS": "2",
        "LORAPLEX_MAX_CPU_LORAS": str(ADAPTERS),
        "LORAPLEX_OPERATOR_TOKEN": OPERATOR_TOKEN,
        "LORAPLEX_DRAIN_SECONDS": "20",
        **extra,
    }


def start_replica(data: ReplicaData, name: str, **extra: str):
    """(url, process, log) of a `serve` replica, ready."""
    return start_server(data.tmp, replica_env(data, name, **extra), name=name)


def redis_required() -> str:
    url = os.environ.get("REDIS_URL", "")
    if not url:
        if os.environ.get("LORAPLEX_REQUIRE_SERVICES") == "1":
            pytest.fail("REDIS_URL is not set")
        pytest.skip("REDIS_URL is not set: replicas share Redis")
    return url
