"""Files built to cost time or to break arithmetic are rejected with a report, quickly; and
whatever escapes the validator still ends the version rejected, never stuck in `validating`.

Each attack once escaped as an exception (ValueError, OverflowError) or ran for minutes:
the version sat in `validating` until the sweep gave up on it, three times over, while the
worker served no one else.
"""

import json
import re
import struct
import time
from pathlib import Path

import pytest
from django.db import OperationalError

from audit.models import AuditEvent
from inference.engine.lora.peft_rules import fingerprint_from_config
from registry.models import AdapterVersion
from registry.services import base_models
from registry.services.versions import adapter_version_create
from registry.tasks import recheck_compatibility, validate_adapter_version
from registry.validation import validate_adapter_files
from tests.registry import safetensors_edit as edit
from tests.registry.conftest import ALICE_ACTOR, make_ready_version, upload
from tests.waiting import wait_for

HUGE = int("9" * 4000)


def files(folder: Path) -> tuple[bytes, bytes]:
    return (
        (folder / "adapter_config.json").read_bytes(),
        (folder / "adapter_model.safetensors").read_bytes(),
    )


def huge_dimensions(config, weights):
    return config, edit.edit_last_tensor(weights, shape=[HUGE] * 200)


def dimensions_whose_product_does_not_print(config, weights):
    # Each converts (1,500 digits), the product (4,500 digits) does not: ValueError once.
    return config, edit.edit_last_tensor(weights, shape=[int("9" * 1500)] * 3)


def huge_layer_index(config, weights):
    return config, edit.rename(weights, "layers.1.", f"layers.{'9' * 5000}.")


def huge_alpha(config, weights):
    return json.dumps(json.loads(config) | {"lora_alpha": 10**400}).encode(), weights


def full_header_of_huge_dimensions(config, weights):
    dims = ",".join(["9" * 4000] * 4000)  # 16 MB: the largest header the parser reads
    raw = f'{{"t": {{"dtype": "F32", "shape": [{dims}], "data_offsets": [0, 4]}}}}'.encode()
    return config, struct.pack("<Q", len(raw)) + raw + bytes(4)


ATTACKS = {
    "huge dimensions": (huge_dimensions, "safetensors", "4000-digit number"),
    "dimension product": (dimensions_whose_product_does_not_print, "safetensors", "1500-digit"),
    "huge layer index": (huge_layer_index, "safetensors", "characters; at most 1024"),
    "lora_alpha 10**400": (huge_alpha, "lora_alpha", "positive number up to 65536"),
}


@pytest.fixture(scope="module")
def fingerprint(tiny_base_dir):
    return fingerprint_from_config(json.loads((tiny_base_dir / "config.json").read_text()))


def validate(tmp_path, fingerprint, config: bytes, weights: bytes):
    c, w = tmp_path / "adapter_config.json", tmp_path / "adapter_model.safetensors"
    c.write_bytes(config)
    w.write_bytes(weights)
    return validate_adapter_files(
        c,
        w,
        fingerprint=fingerprint,
        max_lora_rank=64,
        max_config_bytes=1 << 20,
        max_weights_bytes=1 << 26,
        base_model_name="tiny-llama",
    )


# ---------------------------------------------------------------- the validator


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_each_attack_is_rejected_by_the_validator_with_a_short_reason(
    attack, tmp_path, fingerprint, good_adapter_dir
):
    make, check, words = ATTACKS[attack]
    started = time.perf_counter()
    result = validate(tmp_path, fingerprint, *make(*files(good_adapter_dir)))
    assert time.perf_counter() - started < 2
    assert not result.ok
    failed = {c.name: c.message for c in result.failures}
    assert words in failed[check], failed
    assert len(result.summary()) < 500


def test_a_sixteen_megabyte_header_is_refused_without_parsing_it(
    tmp_path, fingerprint, good_adapter_dir
):
    config, weights = full_header_of_huge_dimensions(*files(good_adapter_dir))
    started = time.perf_counter()
    result = validate(tmp_path, fingerprint, config, weights)
    assert time.perf_counter() - started < 2
    assert "above the limit of 1048576 bytes" in result.summary()


# ---------------------------------------------------------------- the task: nothing stays stuck


def created_version(adapter, folder: Path) -> AdapterVersion:
    with (
        open(folder / "adapter_config.json", "rb") as config,
        open(folder / "adapter_model.safetensors", "rb") as weights,
    ):
        return adapter_version_create(
            adapter=adapter, config=config, weights=weights, actor=ALICE_ACTOR
        )[0]


@pytest.mark.django_db
def test_an_unexpected_exception_rejects_the_version_with_an_error_id_in_the_log(
    adapter, good_adapter_dir, monkeypatch, caplog
):
    version = created_version(adapter, good_adapter_dir)

    def validator_bug(*args, **kwargs):
        raise ZeroDivisionError("a bug in the validator")

    monkeypatch.setattr("registry.services.versions.validate_adapter_files", validator_bug)
    assert validate_adapter_version.apply(args=[version.pk]).get() == "rejected"

    version.refresh_from_db()
    assert version.status == "rejected" and version.infra_failure is True
    error_id = re.search(r"internal error \(error id ([0-9a-f]{32})\)", version.status_detail)[1]
    assert "ZeroDivisionError" not in version.status_detail  # internals stay in the log
    assert version.report[-1] == {
        "name": "validator",
        "passed": False,
        "level": "error",
        "message": version.status_detail,
    }
    logged = [r for r in caplog.records if error_id in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info[0] is ZeroDivisionError
    event = AuditEvent.objects.get(verb="version.rejected")
    assert event.after["detail"] == version.status_detail


@pytest.mark.django_db
def test_a_database_error_is_retried_not_blamed_on_the_files(
    adapter, good_adapter_dir, monkeypatch
):
    version = created_version(adapter, good_adapter_dir)
    calls = []

    def database_gone(*args, **kwargs):
        calls.append(1)
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr("registry.services.versions.validate_adapter_files", database_gone)
    monkeypatch.setattr("registry.tasks.backoff", lambda retries: 0)
    with pytest.raises(OperationalError):
        validate_adapter_version.apply(args=[version.pk]).get()
    assert len(calls) == validate_adapter_version.max_retries + 1
    version.refresh_from_db()
    assert version.status == "validating"  # the sweep takes it from here, as for a lost worker


@pytest.mark.django_db
def test_an_unexpected_exception_in_a_recheck_marks_that_version_incompatible_only(
    adapter, base_model, good_adapter_dir, second_adapter_dir, monkeypatch, caplog
):
    broken = make_ready_version(adapter, good_adapter_dir)
    fine = make_ready_version(adapter, second_adapter_dir)
    base_model.revision = "f" * 64  # a new revision: both must be checked against it
    base_model.save()
    real = base_models.version_recheck

    def bug_for_one(*, version, base_model):
        if version.pk == broken.pk:
            raise KeyError("a bug in the compatibility check")
        return real(version=version, base_model=base_model)

    monkeypatch.setattr(base_models, "version_recheck", bug_for_one)
    assert recheck_compatibility.apply(args=[base_model.pk]).get() == {
        "compatible": 1,
        "incompatible": 1,
    }
    broken.refresh_from_db()
    fine.refresh_from_db()
    assert fine.compatible is True and fine.checked_revision == "f" * 64
    assert broken.compatible is False and broken.checked_revision != "f" * 64
    error_id = re.search(r"error id ([0-9a-f]{32})", broken.compatibility_detail)[1]
    assert any(error_id in r.getMessage() and r.exc_info for r in caplog.records)


# ---------------------------------------------------------------- through the API and a real worker


def test_hostile_uploads_end_rejected_and_the_worker_keeps_serving_everyone(
    s3_worker, tenant_a, base_model, make_key, key_client, good_adapter_dir, second_adapter_dir
):
    _, key = make_key(tenant_a)
    client = key_client(key)
    assert client.post("/api/v1/adapters/", {"name": "support-bot"}, format="json").status_code
    good = files(good_adapter_dir)
    urls = {}
    for attack, (make, _, _) in sorted(ATTACKS.items()):
        config, weights = make(*good)
        response = upload(client, "support-bot", None, config=config, weights=weights)
        assert response.status_code == 202, response.json()
        urls[attack] = response.json()["url"]
    response = upload(client, "support-bot", second_adapter_dir)
    assert response.status_code == 202
    urls["good"] = response.json()["url"]

    started = time.monotonic()
    final = {
        name: wait_for(
            lambda url=url: (b := client.get(url).json())["status"] in ("ready", "rejected") and b,
            what=f"the worker to decide on {name}",
        )
        for name, url in urls.items()
    }
    assert time.monotonic() - started < 60
    assert final.pop("good")["status"] == "ready"
    for attack, body in final.items():
        check, words = ATTACKS[attack][1:]
        assert body["status"] == "rejected", (attack, body["status_detail"])
        failed = {c["name"]: c["message"] for c in body["report"] if not c["passed"]}
        assert words in failed[check], (attack, failed)
