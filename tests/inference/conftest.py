"""A live `manage.py serve` process with the tiny model and a real PEFT adapter.

The server is a separate process on the test database (committed rows, as a real
deployment reads them), so tests talk to it only over HTTP with the real `openai` client.
Everything the fixture creates is deleted afterwards; slugs are unique to this module.
"""

import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.peft_adapters import make_peft_adapter
from tests.processes import SERVE, database_url, launch
from tests.tiny_llama import make_tiny_llama

BASE_NAME = "tiny-serve"


@dataclass
class LiveServer:
    url: str
    key_a: str  # tenant A, all scopes
    key_b: str  # tenant B, all scopes
    key_a_no_inference: str
    adapter_dir: Path
    base_dir: Path
    proc: subprocess.Popen
    log: Path

    def openai(self, key=None):
        from openai import OpenAI

        return OpenAI(
            base_url=f"{self.url}/v1", api_key=key or self.key_a, max_retries=0, timeout=60
        )


def start_server(
    tmp: Path, extra_env: dict | None = None, *, args: Sequence[str] = SERVE, name: str = "serve"
) -> tuple[str, subprocess.Popen, Path]:
    """`serve` (or `args`) on the test database with the tiny model and small budgets."""
    return launch(tmp, server_env(extra_env), args=args, name=name)


def server_env(extra_env: dict | None = None) -> dict:
    """The environment `start_server` gives `serve`: the test database, the tiny model
    (BASE_NAME), small budgets, then `extra_env`."""
    return {
        **os.environ,
        "DATABASE_URL": database_url(),
        "LORAPLEX_ENGINE": "on",
        "LORAPLEX_BASE_MODEL": BASE_NAME,
        "LORAPLEX_KV_CACHE_BYTES": str(8 * 1024 * 1024),
        "LORAPLEX_MAX_LORAS": "2",
        "LORAPLEX_MAX_CPU_LORAS": "4",
        "LORAPLEX_MAX_REQUEST_BYTES": str(64 * 1024),
        "LORAPLEX_DRAIN_SECONDS": "5",
        **(extra_env or {}),
    }


def stop_server(proc: subprocess.Popen):
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def drop_live_rows(tenants: list[str], base, *, previously_default: list[int]) -> None:
    """Undo a live-server fixture's committed rows: its tenants (aliases first: they PROTECT
    versions), its base model, and the default flag where it was before."""
    from registry.models import Adapter, Alias, BaseModel
    from tenants.models import Tenant

    Alias.objects.filter(adapter__tenant__slug__in=tenants).delete()
    Adapter.objects.filter(tenant__slug__in=tenants).delete()
    Tenant.objects.filter(slug__in=tenants).delete()
    base.delete()
    BaseModel.objects.filter(pk__in=previously_default).update(is_default=True)


@pytest.fixture(scope="module")
def serve_data(django_db_setup, django_db_blocker, tmp_path_factory):
    """Rows the server reads: two tenants with keys, the tiny base model, one ready adapter."""
    from registry.models import BaseModel
    from registry.services.adapters import adapter_create
    from registry.services.aliases import alias_set
    from registry.services.base_models import base_model_import
    from registry.services.versions import adapter_version_create, adapter_version_validate
    from tenants.services import api_key_create, tenant_create

    tmp = tmp_path_factory.mktemp("serve")
    base_dir = make_tiny_llama(tmp / "base")
    adapter_dir = make_peft_adapter(
        base_dir,
        tmp / "adapter",
        rank=8,
        alpha=16,
        targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        std=0.5,
        base_model_name=BASE_NAME,
    )
    with django_db_blocker.unblock():
        previously_served = list(
            BaseModel.objects.filter(is_default=True).values_list("pk", flat=True)
        )
        base, _ = base_model_import(name=BASE_NAME, path=base_dir, default=True)
        tenant_a = tenant_create(slug="serve-a", name="Serve A")
        tenant_b = tenant_create(slug="serve-b", name="Serve B")
        _, key_a = api_key_create(
            tenant=tenant_a, name="all", scopes=["inference", "registry:read", "keys:write"]
        )
        _, key_b = api_key_create(
            tenant=tenant_b, name="all", scopes=["inference", "registry:read"]
        )
        _, key_a_ro = api_key_create(tenant=tenant_a, name="ro", scopes=["registry:read"])
        short, key_short = api_key_create(tenant=tenant_a, name="short-lived", scopes=["inference"])
        _, key_limited = api_key_create(tenant=tenant_b, name="limited", scopes=["inference"])
        adapter = adapter_create(tenant=tenant_a, name="pirate", actor="test")
        with (
            open(adapter_dir / "adapter_config.json", "rb") as c,
            open(adapter_dir / "adapter_model.safetensors", "rb") as w,
        ):
            version, _ = adapter_version_create(adapter=adapter, config=c, weights=w, actor="test")
        version = adapter_version_validate(version_id=version.pk)
        assert version.status == "ready", version.report
        alias_set(adapter=adapter, name="production", version_number=version.number, actor="test")
    data = {
        "tmp": tmp,
        "base_dir": base_dir,
        "adapter_dir": adapter_dir,
        "keys": (key_a, key_b, key_a_ro),
        "key_short": (short.pk, key_short),
        "key_limited": key_limited,
    }
    yield data
    with django_db_blocker.unblock():
        drop_live_rows(["serve-a", "serve-b"], base, previously_default=previously_served)


@pytest.fixture(scope="module")
def live_engine_server(serve_data):
    url, proc, log = start_server(serve_data["tmp"])
    key_a, key_b, key_a_ro = serve_data["keys"]
    yield LiveServer(
        url=url,
        key_a=key_a,
        key_b=key_b,
        key_a_no_inference=key_a_ro,
        adapter_dir=serve_data["adapter_dir"],
        base_dir=serve_data["base_dir"],
        proc=proc,
        log=log,
    )
    stop_server(proc)
