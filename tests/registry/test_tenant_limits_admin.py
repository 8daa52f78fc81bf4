"""Operators set a tenant's import prefixes and quotas in the admin's tenant page."""

import pytest

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(client, django_user_model):
    root = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(root)
    return client


def change(operator, tenant, **fields):
    data = {
        "slug": tenant.slug,
        "name": tenant.name,
        "is_active": "on",
        "s3_import_prefixes": "",
        "max_pending_versions": "",
        "max_uploads_per_hour": "",
        "max_adapter_bytes": "",
        "memberships-TOTAL_FORMS": "0",
        "memberships-INITIAL_FORMS": "0",
        "memberships-MIN_NUM_FORMS": "0",
        "memberships-MAX_NUM_FORMS": "1000",
    } | fields
    return operator.post(f"/admin/tenants/tenant/{tenant.pk}/change/", data)


def test_the_tenant_page_sets_import_prefixes_and_quotas(operator, tenant_a):
    page = operator.get(f"/admin/tenants/tenant/{tenant_a.pk}/change/").content.decode()
    assert "Adapter imports and quotas" in page and "LORAPLEX_QUOTA_PENDING_VERSIONS" in page

    response = change(
        operator,
        tenant_a,
        s3_import_prefixes="s3://training-output/tenant-a/\ns3://shared-runs/a/",
        max_pending_versions="3",
        max_uploads_per_hour="0",
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    tenant_a.refresh_from_db()
    assert [str(p) for p in tenant_a.import_prefixes] == [
        "s3://training-output/tenant-a/",
        "s3://shared-runs/a/",
    ]
    assert tenant_a.max_pending_versions == 3 and tenant_a.max_uploads_per_hour == 0
    assert tenant_a.max_adapter_bytes is None  # the deployment's default


def test_a_bad_prefix_is_refused_on_the_page(operator, tenant_a):
    response = change(operator, tenant_a, s3_import_prefixes="s3://training-output/a/../b/")
    assert response.status_code == 200  # the form again, with the error
    assert "must not contain" in response.content.decode()
    tenant_a.refresh_from_db()
    assert tenant_a.s3_import_prefixes == ""
