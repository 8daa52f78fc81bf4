"""The whole path through the REST API with a real Celery worker and S3 (moto's server):
create, upload, validate, stage, promote, audit; and what the serving layer then gets."""

import hashlib

from django.core.files.storage import storages

from inference.engine.lora.peft_rules import ArchFingerprint, load_adapter_tensors
from registry.models import AdapterVersion
from registry.selectors import adapter_version_resolve, base_model_default
from registry.staging import ensure_staged
from tests.registry.conftest import sha256_of, stored_objects, upload
from tests.waiting import wait_for


def test_upload_is_validated_staged_and_promoted_through_a_real_worker(
    s3_worker, tenant_a, base_model, make_key, key_client, good_adapter_dir, settings
):
    _, key = make_key(tenant_a)
    client = key_client(key)

    created = client.post("/api/v1/adapters/", {"name": "support-bot"}, format="json")
    assert created.status_code == 201, created.json()
    assert created.json()["base_model"] == "tiny-llama"

    response = upload(client, "support-bot", good_adapter_dir)
    assert response.status_code == 202, response.json()
    url = response.json()["url"]

    version = wait_for(
        lambda: (body := client.get(url).json())["status"] in ("ready", "rejected") and body,
        what="validation by the worker",
    )
    assert version["status"] == "ready", version["status_detail"]
    assert version["compatible"] is True

    # The objects are in the bucket, byte for byte.
    keys = stored_objects()
    assert len(keys) == 2 and all(k.startswith("adapters/") for k in keys)
    weights_key = next(k for k in keys if k.endswith("adapter_model.safetensors"))
    body = storages["default"].bucket.Object(weights_key).get()["Body"].read()
    assert hashlib.sha256(body).hexdigest() == version["weights_sha256"]

    # The worker staged it into the shared cache: the engine's two files, right sha256.
    row = AdapterVersion.objects.get(adapter__name="support-bot", number=1)
    folder = settings.ADAPTER_CACHE_DIR / row.uid.hex
    wait_for(lambda: (folder / "adapter_model.safetensors").exists(), what="staging")
    assert sorted(p.name for p in folder.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    assert sha256_of(folder / "adapter_model.safetensors") == version["weights_sha256"]
    assert sha256_of(folder / "adapter_config.json") == version["config_sha256"]

    promoted = client.put(
        "/api/v1/adapters/support-bot/aliases/production/", {"version": 1}, format="json"
    )
    assert promoted.status_code == 201, promoted.json()
    assert client.get("/api/v1/adapters/support-bot/aliases/").json()[0]["version"] == 1

    verbs = [e["verb"] for e in client.get("/api/v1/audit/").json()]
    assert verbs == [
        "alias.set",
        "evaluation.passed",  # no eval set: passed unmeasured at once, servable
        "version.ready",
        "version.upload",
        "adapter.create",
        "api_key.create",
    ]

    # What the serving layer calls: the served base, the version a request names, its folder.
    served = base_model_default()
    resolved = adapter_version_resolve(tenant=tenant_a, adapter_name="support-bot")
    assert resolved.pk == row.pk
    assert ensure_staged(resolved) == folder
    spec, factors = load_adapter_tensors(
        folder, ArchFingerprint.from_dict(served.fingerprint), max_lora_rank=settings.MAX_LORA_RANK
    )
    assert spec.rank == 4 and len(factors) == 2 * 2  # 2 layers x (q_proj, v_proj)


def test_import_from_an_allowed_bucket_makes_the_same_version_as_an_upload(
    s3_worker, tenant_a, base_model, make_key, key_client, good_adapter_dir, s3, settings
):
    source_bucket = s3.create_bucket(f"training-{s3.bucket}")
    s3.put_folder(source_bucket, "runs/42/", good_adapter_dir)
    settings.S3_IMPORT_BUCKETS = [source_bucket]
    tenant_a.s3_import_prefixes = f"s3://{source_bucket}/runs/"
    tenant_a.save()
    _, key = make_key(tenant_a)
    client = key_client(key)
    client.post("/api/v1/adapters/", {"name": "imported"}, format="json")

    response = client.post(
        "/api/v1/adapters/imported/versions/",
        {"source": f"s3://{source_bucket}/runs/42/"},
        format="json",
    )
    assert response.status_code == 202, response.json()
    assert response.json()["source"] == f"s3://{source_bucket}/runs/42/"
    assert response.json()["weights_sha256"] == sha256_of(
        good_adapter_dir / "adapter_model.safetensors"
    )
    final = wait_for(
        lambda: (
            (b := client.get(response.json()["url"]).json())["status"] != "pending"
            and b["status"] != "validating"
            and b
        ),
        what="validation",
    )
    assert final["status"] == "ready", final["status_detail"]
    # Same bytes again from the same prefix: the existing version.
    again = client.post(
        "/api/v1/adapters/imported/versions/",
        {"source": f"s3://{source_bucket}/runs/42/"},
        format="json",
    )
    assert again.status_code == 200 and again.json()["number"] == 1
    assert len(stored_objects()) == 2
