"""Two base models served side by side: SmolLM2 and the tiny random Llama, each by its own
`serve` replica behind the shipped HAProxy config (one route per base model, sharing
PostgreSQL and Redis). Each tenant's adapter is answered by the replica of its base, through
the real `openai` client; `/v1/models` names each adapter's base; a model sent down another
base's route, and a base model with no ready replica, answer 503 naming the base model."""

from __future__ import annotations

import signal
import time
from functools import partial

import httpx
import openai
import pytest

from tests.clients import openai_chat
from tests.inference.conftest import stop_server
from tests.smollm2 import smollm2_dir

from .cluster import Replica
from .conftest import BASE_NAME, TARGETS, TENANT, start_replica, upload_ready
from .router import CHECK_INTERVAL_SECONDS, Router

pytestmark = pytest.mark.django_db
SMOL = "routes-smollm2"
SMOL_ADAPTER = "smol-bot"


@pytest.fixture(scope="module")
def smol_base(replica_data, django_db_blocker):
    """SmolLM2 imported as a second base model (not the default) with one ready adapter of
    the test's tenant on it."""
    from registry.models import Adapter, BaseModel
    from registry.services.adapters import adapter_create
    from registry.services.base_models import base_model_import
    from tenants.models import Tenant
    from tests.peft_adapters import make_peft_adapter

    folder = make_peft_adapter(
        smollm2_dir(), replica_data.tmp / SMOL_ADAPTER, rank=4, alpha=8, targets=TARGETS,
        seed=7, std=0.2, base_model_name=SMOL,
    )  # fmt: skip
    with django_db_blocker.unblock():
        base, _ = base_model_import(name=SMOL, path=smollm2_dir(), default=False)
        tenant = Tenant.objects.get(slug=TENANT)
        adapter = adapter_create(
            tenant=tenant, name=SMOL_ADAPTER, actor="test", base_model_name=SMOL
        )
        upload_ready(adapter, folder)
    yield base
    with django_db_blocker.unblock():
        Adapter.objects.filter(tenant__slug=TENANT, name=SMOL_ADAPTER).delete()
        BaseModel.objects.filter(name=SMOL).delete()


@pytest.fixture(scope="module")
def pools(replica_data, smol_base):
    """(router, the tiny base's replica, SmolLM2's replica)."""
    started: list[Replica] = []
    router = None
    try:
        for name, base, extra in (
            ("tiny", BASE_NAME, {}),
            (
                "smol",
                SMOL,
                {
                    "LORAPLEX_MAX_MODEL_LEN": "512",
                    "LORAPLEX_MAX_LORA_RANK": "8",
                    "LORAPLEX_KV_CACHE_BYTES": str(96 << 20),
                },
            ),
        ):
            url, proc, log = start_replica(replica_data, name, LORAPLEX_BASE_MODEL=base, **extra)
            started.append(Replica(name, url, proc, log))
        tiny, smol = started
        router = Router(
            replica_data.tmp,
            {tiny.name: tiny.address},
            pools={SMOL: {smol.name: smol.address}},
        ).start()
        yield router, tiny, smol
    finally:
        if router is not None:
            router.stop()
        for replica in started:
            if replica.proc.poll() is None:
                stop_server(replica.proc)


def client(router: Router, key: str, base: str | None = None) -> openai.OpenAI:
    """The default base model's route (/v1), or `base`'s own (/bases/<base>/v1)."""
    prefix = "" if base is None else f"/bases/{base}"
    return openai.OpenAI(base_url=f"{router.url}{prefix}/v1", api_key=key, max_retries=0)


chat = partial(  # chat(client(...), model)
    openai_chat,
    messages=[{"role": "user", "content": "What is the capital of France?"}],
    max_tokens=4,
    temperature=0,
    timeout=120,
)


def holds(replica: Replica, prefix: str) -> bool:
    return any(name.startswith(prefix) for name in replica.loaded_adapters())


def test_each_adapter_is_answered_by_the_replica_of_its_base(pools, replica_data):
    router, tiny, smol = pools
    tiny_adapter = replica_data.adapters[0]
    answer = chat(client(router, replica_data.key), tiny_adapter)
    assert answer.model == tiny_adapter and answer.choices[0].message.content
    answer = chat(client(router, replica_data.key, SMOL), SMOL_ADAPTER)
    assert answer.model == SMOL_ADAPTER and answer.choices[0].message.content
    base_answer = chat(client(router, replica_data.key, SMOL), SMOL)
    assert base_answer.choices[0].message.content
    assert holds(tiny, f"{TENANT}/{tiny_adapter}:") and not holds(tiny, f"{TENANT}/{SMOL_ADAPTER}:")
    assert holds(smol, f"{TENANT}/{SMOL_ADAPTER}:") and not holds(smol, f"{TENANT}/{tiny_adapter}:")


@pytest.mark.parametrize("route", [None, SMOL])
def test_the_model_list_names_each_adapters_base_on_every_route(pools, replica_data, route):
    router, _, _ = pools
    listed = {m.id: m for m in client(router, replica_data.key, route).models.list()}
    assert {BASE_NAME, SMOL} <= set(listed)
    assert listed[SMOL_ADAPTER].parent == SMOL  # type: ignore[attr-defined]
    assert listed[replica_data.adapters[0]].parent == BASE_NAME  # type: ignore[attr-defined]


def test_a_model_sent_down_another_bases_route_names_its_base(pools, replica_data):
    router, _, _ = pools
    with pytest.raises(openai.APIStatusError) as refused:
        chat(client(router, replica_data.key), SMOL_ADAPTER)  # the default route: tiny's
    assert refused.value.status_code == 503
    error = refused.value.body
    assert isinstance(error, dict) and error["code"] == "base_model_unavailable"
    assert f"runs on base model '{SMOL}'" in error["message"]


def test_a_base_model_with_no_ready_replica_answers_503_naming_it(pools, replica_data):
    router, tiny, smol = pools
    smol.signal(signal.SIGTERM)
    smol.proc.wait(timeout=60)
    deadline = time.monotonic() + CHECK_INTERVAL_SECONDS * 10
    while router.servers_up() != 1:  # `fall 2` checks
        assert time.monotonic() < deadline, "the router still counts the stopped replica"
        time.sleep(0.2)
    with pytest.raises(openai.APIStatusError) as refused:
        chat(client(router, replica_data.key, SMOL), SMOL_ADAPTER)
    assert refused.value.status_code == 503
    error = refused.value.body
    assert isinstance(error, dict) and error["code"] == "base_model_unavailable"
    assert f"Base model {SMOL} has no ready replica" in error["message"]
    raw = httpx.post(f"{router.url}/bases/{SMOL}/v1/completions", json={"model": SMOL})
    assert raw.headers["content-type"] == "application/json"
    # the other base model's replica serves on
    assert chat(client(router, replica_data.key), replica_data.adapters[1]).choices
