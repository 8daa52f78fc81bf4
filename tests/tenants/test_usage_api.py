"""GET /api/v1/usage/: the tenant's own records, one row per adapter and version or per day;
metering writes them."""

from datetime import timedelta

import pytest
from django.utils import timezone

from inference import usage
from registry.models import Adapter, AdapterVersion, BaseModel
from tenants.models import UsageRecord
from tenants.usage import usage_totals
from tests.usage_records import usage_record

pytestmark = pytest.mark.django_db


def version_of(tenant, adapter_name: str, number: int) -> AdapterVersion:
    """A bare version row: usage only needs something to count against."""
    base, _ = BaseModel.objects.get_or_create(
        name="tiny-llama",
        defaults={"revision": "0" * 64, "fingerprint": {}, "local_path": "/models/tiny"},
    )
    adapter, _ = Adapter.objects.get_or_create(
        tenant=tenant, name=adapter_name, defaults={"base_model": base, "created_by": "test"}
    )
    return AdapterVersion.objects.create(
        adapter=adapter,
        number=number,
        status="ready",
        config_key="c",
        weights_key="w",
        config_sha256="0" * 64,
        weights_sha256="0" * 64,
        config_size=1,
        weights_size=1,
        created_by="test",
    )


def test_usage_by_adapter_and_by_day(tenant_a, tenant_b, make_key, key_client):
    bot, other = version_of(tenant_a, "bot", 3), version_of(tenant_a, "other", 1)
    usage_record(tenant_a, "bot", 10, 5, version=bot)
    usage_record(tenant_a, "bot", 1, 1, version=bot, days_ago=1)
    usage_record(tenant_a, "other", 3, 4, version=other)
    usage_record(tenant_b, "bot", 100, 100, version=version_of(tenant_b, "bot", 3))
    _, key = make_key(tenant_a, scopes=["registry:read"])
    client = key_client(key)
    by_adapter = client.get("/api/v1/usage/").json()["data"]
    assert by_adapter == [
        {
            "adapter": "bot",
            "version": 3,
            "requests": 2,
            "prompt_tokens": 11,
            "completion_tokens": 6,
            "total_tokens": 17,
        },
        {
            "adapter": "other",
            "version": 1,
            "requests": 1,
            "prompt_tokens": 3,
            "completion_tokens": 4,
            "total_tokens": 7,
        },
    ]
    by_day = client.get("/api/v1/usage/?group_by=day").json()["data"]
    assert [row["total_tokens"] for row in by_day] == [2, 22]
    start = (timezone.now() - timedelta(hours=1)).isoformat()
    recent = client.get("/api/v1/usage/", {"start": start}).json()["data"]
    assert sum(row["requests"] for row in recent) == 2


def test_every_name_for_one_version_counts_in_one_row(tenant_a, make_key, key_client):
    v2, v3 = version_of(tenant_a, "bot", 2), version_of(tenant_a, "bot", 3)
    for model in ("bot", "bot@canary", "bot:3"):  # the bare name, an alias, the number
        usage_record(tenant_a, model, 1, 1, version=v3)
    usage_record(tenant_a, "bot:2", 5, 0, version=v2)
    usage_record(tenant_a, "tiny-llama", 7, 7)  # the base model alone: its own row, under its name
    _, key = make_key(tenant_a, scopes=["registry:read"])
    rows = key_client(key).get("/api/v1/usage/").json()["data"]
    assert [(r["adapter"], r["version"], r["requests"], r["total_tokens"]) for r in rows] == [
        ("bot", 2, 1, 5),
        ("bot", 3, 3, 6),
        ("tiny-llama", None, 1, 14),
    ]


@pytest.mark.parametrize(
    "query, param",
    [
        ("group_by=tenant", "group_by"),
        ("start=yesterday", "start"),
        ("start=2030-01-02T00:00:00Z&end=2030-01-01T00:00:00Z", "start"),
        ("end=0001-01-02T00:00:00Z", "end"),  # 30 days before it is no date: was a 500
        ("end=10000-01-01T00:00:00Z", "end"),
    ],
)
def test_bad_usage_queries_name_the_parameter(tenant_a, make_key, key_client, query, param):
    _, key = make_key(tenant_a, scopes=["registry:read"])
    response = key_client(key).get(f"/api/v1/usage/?{query}")
    assert response.status_code == 400 and response.json()["error"]["param"] == param


def test_usage_needs_registry_read(tenant_a, make_key, key_client):
    _, key = make_key(tenant_a, scopes=["inference"])
    assert key_client(key).get("/api/v1/usage/").status_code == 403


def test_metering_writes_records_in_batches(tenant_a):
    for i in range(3):
        usage.record(
            tenant_id=tenant_a.id,
            model="bot",
            endpoint="completions",
            prompt_tokens=i,
            completion_tokens=1,
            duration_ms=5,
            status=UsageRecord.OK,
        )
    usage.flush()
    assert sorted(UsageRecord.objects.values_list("prompt_tokens", flat=True)) == [0, 1, 2]


def test_metered_requests_count_for_the_version_they_ran(tenant_a):
    version = version_of(tenant_a, "bot", 1)
    for model in ("bot", "bot@production"):
        usage.record(
            tenant_id=tenant_a.id,
            adapter_version_id=version.id,
            model=model,
            endpoint="completions",
            prompt_tokens=2,
            completion_tokens=3,
            duration_ms=5,
            status=UsageRecord.OK,
        )
    usage.flush()
    now = timezone.now()
    rows = usage_totals(
        tenant=tenant_a, start=now - timedelta(hours=1), end=now, by=("adapter", "version")
    )
    assert rows == [
        {
            "adapter": "bot",
            "version": 1,
            "requests": 2,
            "prompt_tokens": 4,
            "completion_tokens": 6,
            "total_tokens": 10,
        }
    ]
