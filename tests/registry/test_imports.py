"""Importing from S3 (moto's server): the errors a tenant can cause, each leaving nothing behind."""

import pytest

from registry.models import AdapterVersion
from tests.registry.conftest import stored_objects

pytestmark = pytest.mark.django_db
VERSIONS = "/api/v1/adapters/support-bot/versions/"


@pytest.fixture
def training(s3, settings):
    bucket = s3.create_bucket(f"training-{s3.bucket}")
    settings.S3_IMPORT_BUCKETS = [bucket]
    return bucket


@pytest.fixture
def client(adapter, alice, user_client):
    return user_client(alice)


def test_a_missing_file_under_the_prefix_is_400_naming_it(client, s3, training, good_adapter_dir):
    s3.put_folder(training, "run/", good_adapter_dir, files=["adapter_config.json"])
    response = client.post(VERSIONS, {"source": f"s3://{training}/run/"}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "source_not_found"
    assert (
        f"adapter_model.safetensors not found at s3://{training}/run/adapter_model.safetensors"
        in (response.json()["error"]["message"])
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


def test_a_bucket_that_does_not_exist_is_400(client, s3, settings):
    settings.S3_IMPORT_BUCKETS = ["no-such-bucket"]
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
