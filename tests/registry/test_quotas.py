"""Per-tenant quotas: versions awaiting validation, uploads and imports per hour, stored bytes.

Over a quota the answer is 429 (with Retry-After) or 403, with a code and a message naming
the quota, and nothing is stored: no version row, no object, no audit event of an upload.
"""

import json
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from audit.models import AuditEvent
from registry.models import AdapterVersion
from registry.services import versions
from registry.services.adapters import adapter_create
from registry.services.quotas import quota_check
from registry.services.versions import adapter_version_create, adapter_version_validate
from tests.registry.conftest import ALICE_ACTOR, stored_objects, upload

pytestmark = pytest.mark.django_db


@pytest.fixture
def client(adapter, alice, user_client):
    return user_client(alice)


@pytest.fixture
def no_quotas(settings):
    """Every quota off; each test turns on the one it is about."""
    settings.QUOTA_PENDING_VERSIONS = 0
    settings.QUOTA_UPLOADS_PER_HOUR = 0
    settings.QUOTA_ADAPTER_BYTES = 0
    return settings


def variant(folder, n: int) -> dict:
    """Upload parts with bytes of their own: the same adapter, another description."""
    config = json.loads((folder / "adapter_config.json").read_text()) | {"revision": f"v{n}"}
    return {"config": json.dumps(config).encode()}


def refused(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert error["code"] == code
    return error


def assert_only_versions(n: int) -> None:
    """n versions, their 2n objects and n upload events: the refusal added nothing."""
    assert AdapterVersion.objects.count() == n
    assert len(stored_objects()) == 2 * n
    assert AuditEvent.objects.filter(verb="version.upload").count() == n


def test_the_defaults_are_generous_and_on(settings):
    assert settings.QUOTA_PENDING_VERSIONS == 10
    assert settings.QUOTA_UPLOADS_PER_HOUR == 60
    assert settings.QUOTA_ADAPTER_BYTES == 20 * 1024**3


# ---------------------------------------------------------------- pending versions


def test_too_many_pending_versions_is_429_naming_the_quota(
    client, adapter, no_quotas, good_adapter_dir
):
    no_quotas.QUOTA_PENDING_VERSIONS = 2
    for n in range(2):
        assert upload(client, adapter.name, good_adapter_dir, **variant(good_adapter_dir, n))
    response = upload(client, adapter.name, good_adapter_dir, **variant(good_adapter_dir, 2))
    error = refused(response, 429, "quota_pending_versions")
    assert "2 versions awaiting validation" in error["message"]
    assert "pending-versions quota of 2" in error["message"]
    assert response["Retry-After"] == "30"
    assert_only_versions(2)

    # Validated, a version stops counting.
    adapter_version_validate(version_id=AdapterVersion.objects.order_by("number").first().pk)
    response = upload(client, adapter.name, good_adapter_dir, **variant(good_adapter_dir, 2))
    assert response.status_code == 202, response.json()


def test_a_tenants_own_limit_overrides_the_default_and_zero_means_none(
    client, adapter, no_quotas, good_adapter_dir
):
    no_quotas.QUOTA_PENDING_VERSIONS = 1
    adapter.tenant.max_pending_versions = 3
    adapter.tenant.save()
    for n in range(3):
        response = upload(client, adapter.name, good_adapter_dir, **variant(good_adapter_dir, n))
        assert response.status_code == 202
    response = upload(client, adapter.name, good_adapter_dir, **variant(good_adapter_dir, 3))
    refused(response, 429, "quota_pending_versions")

    adapter.tenant.max_pending_versions = 0
    adapter.tenant.save()
    response = upload(client, adapter.name, good_adapter_dir, **variant(good_adapter_dir, 3))
    assert response.status_code == 202


def test_other_tenants_pending_versions_do_not_count(
    client, adapter, no_quotas, tenant_b, good_adapter_dir
):
    no_quotas.QUOTA_PENDING_VERSIONS = 1
    theirs = adapter_create(tenant=tenant_b, name="theirs", actor="user:charlie@example.com")
    with (
        open(good_adapter_dir / "adapter_config.json", "rb") as c,
        open(good_adapter_dir / "adapter_model.safetensors", "rb") as w,
    ):
        adapter_version_create(adapter=theirs, config=c, weights=w, actor="c")
    assert upload(client, adapter.name, good_adapter_dir).status_code == 202


# ---------------------------------------------------------------- uploads per hour


def test_uploads_per_hour_is_429_with_the_seconds_until_a_slot_frees(
    client, adapter, no_quotas, good_adapter_dir
):
    no_quotas.QUOTA_UPLOADS_PER_HOUR = 2
    for n in range(2):
        response = upload(client, adapter.name, good_adapter_dir, **variant(good_adapter_dir, n))
        assert response.status_code == 202
    first = AuditEvent.objects.filter(verb="version.upload").order_by("created_at").first()
    AuditEvent.objects.filter(pk=first.pk).update(created_at=timezone.now() - timedelta(minutes=50))

    response = upload(client, adapter.name, good_adapter_dir, **variant(good_adapter_dir, 2))
    error = refused(response, 429, "quota_uploads_per_hour")
    assert "2 uploads and imports in the last hour" in error["message"]
    assert 9 * 60 < int(response["Retry-After"]) <= 10 * 60  # the oldest leaves in 10 minutes
    assert_only_versions(2)

    AuditEvent.objects.filter(pk=first.pk).update(created_at=timezone.now() - timedelta(minutes=61))
    response = upload(client, adapter.name, good_adapter_dir, **variant(good_adapter_dir, 2))
    assert response.status_code == 202


def test_deleting_adapters_does_not_give_uploads_back(client, adapter, no_quotas, good_adapter_dir):
    no_quotas.QUOTA_UPLOADS_PER_HOUR = 1
    assert upload(client, adapter.name, good_adapter_dir).status_code == 202
    assert client.delete(f"/api/v1/adapters/{adapter.name}/?force=true").status_code == 204
    assert client.post("/api/v1/adapters/", {"name": "again"}, format="json").status_code == 201
    refused(upload(client, "again", good_adapter_dir), 429, "quota_uploads_per_hour")


def test_an_identical_upload_is_not_counted(client, adapter, no_quotas, good_adapter_dir):
    no_quotas.QUOTA_UPLOADS_PER_HOUR = 2
    assert upload(client, adapter.name, good_adapter_dir).status_code == 202
    assert upload(client, adapter.name, good_adapter_dir).status_code == 200  # the same version
    response = upload(client, adapter.name, good_adapter_dir, **variant(good_adapter_dir, 1))
    assert response.status_code == 202
    assert_only_versions(2)


def test_an_over_quota_body_is_not_even_spilled_to_disk(
    adapter, make_key, key_client, no_quotas, good_adapter_dir, monkeypatch
):
    from registry.uploads import LimitedUploadHandler

    no_quotas.QUOTA_UPLOADS_PER_HOUR = 1
    client = key_client(make_key(adapter.tenant)[1])
    assert upload(client, adapter.name, good_adapter_dir).status_code == 202
    spilled = []
    real = LimitedUploadHandler.new_file
    monkeypatch.setattr(
        LimitedUploadHandler,
        "new_file",
        lambda self, *a, **kw: spilled.append(a[0]) or real(self, *a, **kw),
    )
    response = upload(client, adapter.name, good_adapter_dir, **variant(good_adapter_dir, 1))
    refused(response, 429, "quota_uploads_per_hour")
    assert spilled == []


# ---------------------------------------------------------------- stored bytes


def test_stored_bytes_past_the_quota_is_403_and_stores_nothing(
    client, adapter, no_quotas, good_adapter_dir, second_adapter_dir
):
    first = sum(
        (good_adapter_dir / f).stat().st_size
        for f in ("adapter_config.json", "adapter_model.safetensors")
    )
    second = sum(
        (second_adapter_dir / f).stat().st_size
        for f in ("adapter_config.json", "adapter_model.safetensors")
    )
    no_quotas.QUOTA_ADAPTER_BYTES = first + second - 1
    assert upload(client, adapter.name, good_adapter_dir).status_code == 202
    error = refused(upload(client, adapter.name, second_adapter_dir), 403, "quota_adapter_bytes")
    assert f"stores {first} bytes" in error["message"]
    assert (
        f"{second} more would pass its adapter-bytes quota of {first + second - 1}"
        in (error["message"])
    )
    assert_only_versions(1)

    adapter.tenant.max_adapter_bytes = first + second
    adapter.tenant.save()
    assert upload(client, adapter.name, second_adapter_dir).status_code == 202


# ---------------------------------------------------------------- concurrency


@pytest.mark.django_db(transaction=True)
def test_concurrent_uploads_cannot_both_slip_under_a_quota(
    tenant_a, base_model, no_quotas, good_adapter_dir, second_adapter_dir, monkeypatch
):
    """Two adapters, one tenant, a quota of one pending version: exactly one upload wins.

    The check under the lock is slowed down, so without the tenant's row lock the second
    upload would count before the first one's row exists.
    """
    no_quotas.QUOTA_PENDING_VERSIONS = 1
    adapters = [adapter_create(tenant=tenant_a, name=f"a{i}", actor=ALICE_ACTOR) for i in (0, 1)]
    real = versions.quota_check

    def slow_check(**kwargs):
        real(**kwargs)
        if connection.in_atomic_block:  # the check under the lock: hold it a while
            time.sleep(0.5)

    monkeypatch.setattr(versions, "quota_check", slow_check)
    outcomes: list[object] = []
    start = threading.Barrier(2)

    def create(adapter, folder):
        try:
            start.wait()
            with (
                open(folder / "adapter_config.json", "rb") as c,
                open(folder / "adapter_model.safetensors", "rb") as w,
            ):
                outcomes.append(
                    adapter_version_create(adapter=adapter, config=c, weights=w, actor="t")[1]
                )
        except Exception as exc:
            outcomes.append(type(exc).__name__)
        finally:
            connection.close()

    threads = [
        threading.Thread(target=create, args=(a, f))
        for a, f in zip(adapters, (good_adapter_dir, second_adapter_dir), strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(map(str, outcomes)) == ["PendingVersionsQuotaExceeded", "True"]
    assert AdapterVersion.objects.count() == 1
    assert len(stored_objects()) == 2


def test_quota_check_with_no_new_bytes_refuses_only_a_tenant_already_over(
    adapter, no_quotas, good_adapter_dir
):
    with (
        open(good_adapter_dir / "adapter_config.json", "rb") as c,
        open(good_adapter_dir / "adapter_model.safetensors", "rb") as w,
    ):
        version, _ = adapter_version_create(adapter=adapter, config=c, weights=w, actor="t")
    no_quotas.QUOTA_ADAPTER_BYTES = version.size
    quota_check(tenant=adapter.tenant)
    no_quotas.QUOTA_ADAPTER_BYTES = version.size - 1
    with pytest.raises(Exception, match="adapter-bytes quota"):
        quota_check(tenant=adapter.tenant)
