"""/api/v1/adapters/{name}/versions/: upload, dedup, poll; validation run in-process here
(the same service the Celery task calls; the worker itself is exercised in test_pipeline)."""

import pytest

from audit.models import AuditEvent
from registry.models import AdapterVersion
from registry.services.versions import adapter_version_validate
from tests.registry.conftest import sha256_of, stored_objects, upload

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice_client(tenant_a, alice, user_client):
    return user_client(alice)


def test_upload_answers_202_with_a_pending_version_and_a_url_to_poll(
    adapter, alice_client, good_adapter_dir
):
    response = upload(alice_client, "support-bot", good_adapter_dir)
    assert response.status_code == 202, response.json()
    body = response.json()
    assert body["number"] == 1 and body["status"] == "pending"
    assert body["url"].endswith("/api/v1/adapters/support-bot/versions/1/")
    assert response["Location"] == body["url"]
    assert body["weights_sha256"] == sha256_of(good_adapter_dir / "adapter_model.safetensors")
    assert body["config_sha256"] == sha256_of(good_adapter_dir / "adapter_config.json")
    assert body["created_by"] == "user:alice@example.com"
    assert len(stored_objects()) == 2
    assert alice_client.get(body["url"]).json()["status"] == "pending"


def test_validation_makes_a_real_peft_adapter_ready_with_a_readable_report(
    adapter, alice_client, good_adapter_dir
):
    number = upload(alice_client, "support-bot", good_adapter_dir).json()["number"]
    version = AdapterVersion.objects.get(adapter=adapter, number=number)
    adapter_version_validate(version_id=version.pk)
    body = alice_client.get(f"/api/v1/adapters/support-bot/versions/{number}/").json()
    assert body["status"] == "ready", body["status_detail"]
    assert body["rank"] == 4 and body["alpha"] == 8.0
    assert body["target_modules"] == ["q_proj", "v_proj"]
    assert body["compatible"] is True and body["attempts"] == 1
    checks = {c["name"]: c for c in body["report"]}
    for name in ("sha256", "safetensors", "r", "shapes", "finite", "layers", "base_model"):
        assert checks[name]["passed"], checks[name]
    assert all(set(c) == {"name", "passed", "level", "message"} for c in body["report"])
    verbs = list(AuditEvent.objects.filter(tenant=adapter.tenant).values_list("verb", flat=True))
    assert "version.upload" in verbs and "version.ready" in verbs


def test_identical_bytes_return_the_existing_version_and_store_nothing_new(
    adapter, alice_client, good_adapter_dir
):
    first = upload(alice_client, "support-bot", good_adapter_dir)
    objects = stored_objects()
    again = upload(alice_client, "support-bot", good_adapter_dir)
    assert again.status_code == 200
    assert again.json()["number"] == first.json()["number"] == 1
    assert stored_objects() == objects
    assert AdapterVersion.objects.count() == 1
    event = AuditEvent.objects.get(verb="version.upload_duplicate")
    assert event.after == {"source": "upload", "duplicate_of": 1, "status": "pending"}


def test_different_bytes_make_the_next_number(
    adapter, alice_client, good_adapter_dir, second_adapter_dir
):
    upload(alice_client, "support-bot", good_adapter_dir)
    second = upload(alice_client, "support-bot", second_adapter_dir)
    assert second.status_code == 202 and second.json()["number"] == 2
    listed = alice_client.get("/api/v1/adapters/support-bot/versions/").json()
    assert [v["number"] for v in listed] == [2, 1]


def test_validating_twice_is_harmless(adapter, alice_client, good_adapter_dir):
    upload(alice_client, "support-bot", good_adapter_dir)
    version = AdapterVersion.objects.get()
    adapter_version_validate(version_id=version.pk)
    events = AuditEvent.objects.count()
    assert adapter_version_validate(version_id=version.pk) is None  # a redelivered task
    assert adapter_version_validate(version_id=999999) is None  # a deleted version
    version.refresh_from_db()
    assert version.status == "ready" and version.attempts == 1
    assert AuditEvent.objects.count() == events
