"""Importing from S3 (moto's server): the errors a tenant can cause, each leaving nothing behind."""

import re

import pytest

from registry.models import AdapterVersion
from tests.registry.conftest import stored_objects

pytestmark = pytest.mark.django_db
VERSIONS = "/api/v1/adapters/support-bot/versions/"


def allow(tenant, *prefixes: str) -> None:
    """What an operator does in the admin: the prefixes this tenant may import from."""
    tenant.s3_import_prefixes = "\n".join(prefixes)
    tenant.full_clean()
    tenant.save()


@pytest.fixture
def training(s3, settings, tenant_a):
    bucket = s3.create_bucket(f"training-{s3.bucket}")
    settings.S3_IMPORT_BUCKETS = [bucket]
    allow(tenant_a, f"s3://{bucket}/")
    return bucket


@pytest.fixture
def client(adapter, alice, user_client):
    return user_client(alice)


def test_a_missing_file_under_the_prefix_is_400_naming_it(client, s3, training, good_adapter_dir):
    s3.put_folder(training, "run/", good_adapter_dir, files=["adapter_config.json"])
    response = client.post(VERSIONS, {"source": f"s3://{training}/run/"}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "source_not_found"
    assert response.json()["error"]["message"] == (
        f"adapter_model.safetensors not found at s3://{training}/run/adapter_model.safetensors"
        ", or not readable by this deployment"
    )
    assert stored_objects() == [] and AdapterVersion.objects.count() == 0


def test_an_oversized_source_object_is_413_before_copying(
    client, s3, training, good_adapter_dir, settings
):
    s3.put_folder(training, "run/", good_adapter_dir)
    settings.MAX_ADAPTER_BYTES = 100
    response = client.post(VERSIONS, {"source": f"s3://{training}/run/"}, format="json")
    assert response.status_code == 413
    assert "weights" in response.json()["error"]["message"]
    assert stored_objects() == [] and AdapterVersion.objects.count() == 0


def test_a_bucket_that_does_not_exist_is_400(client, s3, settings, tenant_a):
    settings.S3_IMPORT_BUCKETS = ["no-such-bucket"]
    allow(tenant_a, "s3://no-such-bucket/")
    response = client.post(VERSIONS, {"source": "s3://no-such-bucket/run/"}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "source_not_found"


def test_an_import_lands_in_the_deployments_bucket_under_a_version_key(
    client, s3, training, good_adapter_dir
):
    s3.put_folder(training, "deep/run-7/", good_adapter_dir)
    response = client.post(VERSIONS, {"source": f"s3://{training}/deep/run-7/"}, format="json")
    assert response.status_code == 202
    keys = stored_objects()
    assert len(keys) == 2 and all(k.startswith("adapters/") for k in keys)
    listed = s3.client.list_objects_v2(Bucket=training)["Contents"]
    assert len(listed) == 2  # the source is only read


# ---------------------------------------------------------------- where a tenant may import from


@pytest.mark.parametrize(
    "source",
    [
        "s3://{b}/tenant-b/run/",  # another tenant's prefix in the same bucket
        "s3://{b}/tenant-a-evil/run/",  # shares the characters, not the path segment
        "s3://{b}/",  # the whole bucket
        "s3://{b}/other/tenant-a/run/",
    ],
)
def test_a_source_outside_the_tenants_prefixes_is_refused(
    source, client, s3, training, tenant_a, good_adapter_dir
):
    allow(tenant_a, f"s3://{training}/tenant-a/")
    s3.put_folder(training, "tenant-b/run/", good_adapter_dir)
    s3.put_folder(training, "tenant-a-evil/run/", good_adapter_dir)
    response = client.post(VERSIONS, {"source": source.format(b=training)}, format="json")
    assert response.status_code == 400, response.json()
    error = response.json()["error"]
    assert error["code"] == "source_not_allowed" and error["param"] == "source"
    assert (
        f"not under an import prefix of this tenant (s3://{training}/tenant-a/)"
        in (error["message"])
    )
    assert stored_objects() == [] and AdapterVersion.objects.count() == 0


def test_a_source_under_one_of_the_tenants_prefixes_is_imported(
    client, s3, training, tenant_a, good_adapter_dir
):
    other = s3.create_bucket(f"other-{s3.bucket}")
    allow(tenant_a, f"s3://{other}/x/", f"s3://{training}/tenant-a/")
    s3.put_folder(training, "tenant-a/runs/7/", good_adapter_dir)
    response = client.post(VERSIONS, {"source": f"s3://{training}/tenant-a/runs/7/"}, format="json")
    assert response.status_code == 202, response.json()


def test_a_tenant_without_prefixes_imports_nothing(client, s3, training, tenant_a):
    allow(tenant_a)
    response = client.post(VERSIONS, {"source": f"s3://{training}/run/"}, format="json")
    assert response.status_code == 400
    assert "none are set; an operator sets them in the admin" in response.json()["error"]["message"]


def test_the_operators_bucket_list_still_fences_every_prefix(client, s3, training, settings):
    settings.S3_IMPORT_BUCKETS = []  # imports off for the deployment, whatever tenants allow
    response = client.post(VERSIONS, {"source": f"s3://{training}/run/"}, format="json")
    assert response.status_code == 400
    assert "is not open for imports on this deployment" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    "prefixes, words",
    [
        ("s3://training/../x/", "'.', '..'"),
        ("s3://training/a/\nhttp://x/", "line 2: must look like s3://bucket/prefix/"),
        ("s3://Training/", "must look like"),
    ],
)
def test_bad_prefixes_are_refused_when_an_operator_saves_them(tenant_a, prefixes, words):
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError, match=re.escape(words)):
        allow(tenant_a, prefixes)


# ------------------------------------------------------------ missing and unreadable: one answer


def deny_reads(monkeypatch):
    """The source bucket answers AccessDenied to every GetObject, as a real policy would."""
    from botocore.awsrequest import AWSResponse

    from registry import uploads

    real = uploads._s3_client

    def deny(**kwargs):
        body = {"Code": "AccessDenied", "Message": "Access Denied"}
        return AWSResponse("https://s3", 403, {}, None), {
            "Error": body,
            "ResponseMetadata": {"HTTPStatusCode": 403},
        }

    def client():
        made = real()
        made.meta.events.register("before-call.s3.GetObject", deny)
        return made

    monkeypatch.setattr(uploads, "_s3_client", client)


def test_missing_and_unreadable_files_get_one_identical_answer(
    client, s3, training, good_adapter_dir, monkeypatch
):
    source = {"source": f"s3://{training}/run/"}
    s3.put_folder(training, "run/", good_adapter_dir, files=["adapter_model.safetensors"])
    missing = client.post(VERSIONS, source, format="json")

    # Archived: the server itself refuses the read (403 InvalidObjectState).
    config = (good_adapter_dir / "adapter_config.json").read_bytes()
    s3.client.put_object(
        Bucket=training, Key="run/adapter_config.json", Body=config, StorageClass="GLACIER"
    )
    archived = client.post(VERSIONS, source, format="json")

    s3.put_folder(training, "run/", good_adapter_dir)
    deny_reads(monkeypatch)
    denied = client.post(VERSIONS, source, format="json")

    assert missing.status_code == archived.status_code == denied.status_code == 400
    assert missing.content == archived.content == denied.content
    assert missing.json()["error"]["code"] == "source_not_found"
    assert dict(missing.headers) == dict(denied.headers)
    assert stored_objects() == [] and AdapterVersion.objects.count() == 0
