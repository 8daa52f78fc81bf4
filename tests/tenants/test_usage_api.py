"""GET /api/v1/usage/: the tenant's own records, grouped by adapter or day; metering writes them."""

from datetime import timedelta

import pytest
from django.utils import timezone

from inference import usage
from tenants.models import UsageRecord

pytestmark = pytest.mark.django_db


def add(tenant, model, prompt, completion, days_ago=0):
    UsageRecord.objects.create(tenant=tenant, model=model, endpoint="chat.completions", prompt_tokens=prompt,
                               completion_tokens=completion, created_at=timezone.now() - timedelta(days=days_ago))


def test_usage_by_adapter_and_by_day(tenant_a, tenant_b, make_key, key_client):
    add(tenant_a, "bot", 10, 5)
    add(tenant_a, "bot", 1, 1, days_ago=1)
    add(tenant_a, "other", 3, 4)
    add(tenant_b, "bot", 100, 100)
    _, key = make_key(tenant_a, scopes=["registry:read"])
    client = key_client(key)
    by_adapter = client.get("/api/v1/usage/").json()["data"]
    assert by_adapter == [
        {"adapter": "bot", "requests": 2, "prompt_tokens": 11, "completion_tokens": 6, "total_tokens": 17},
        {"adapter": "other", "requests": 1, "prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
    ]
    by_day = client.get("/api/v1/usage/?group_by=day").json()["data"]
    assert [row["total_tokens"] for row in by_day] == [2, 22]
    start = (timezone.now() - timedelta(hours=1)).isoformat()
    recent = client.get("/api/v1/usage/", {"start": start}).json()["data"]
    assert sum(row["requests"] for row in recent) == 2


@pytest.mark.parametrize("query, param", [("group_by=tenant", "group_by"), ("start=yesterday", "start"),
                                          ("start=2030-01-02T00:00:00Z&end=2030-01-01T00:00:00Z", "start")])
def test_bad_usage_queries_name_the_parameter(tenant_a, make_key, key_client, query, param):
    _, key = make_key(tenant_a, scopes=["registry:read"])
    response = key_client(key).get(f"/api/v1/usage/?{query}")
    assert response.status_code == 400 and response.json()["error"]["param"] == param


def test_usage_needs_registry_read(tenant_a, make_key, key_client):
    _, key = make_key(tenant_a, scopes=["inference"])
    assert key_client(key).get("/api/v1/usage/").status_code == 403


def test_metering_writes_records_in_batches(tenant_a):
    for i in range(3):
        usage.record(tenant_id=tenant_a.id, model="bot", endpoint="completions", prompt_tokens=i,
                     completion_tokens=1, duration_ms=5, status=UsageRecord.OK)
    usage.flush()
    assert sorted(UsageRecord.objects.values_list("prompt_tokens", flat=True)) == [0, 1, 2]
