"""Adapter versions: create from two files, validate, reject, re-validate, sweep the stuck.

Status only moves forward (pending -> validating -> ready | rejected); every transition
happens under a row lock and is idempotent, so a redelivered or duplicated task is harmless.
"""

from __future__ import annotations

import logging
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import BinaryIO

from django.conf import settings
from django.db import transaction
from django.db.models import Max, Q
from django.utils import timezone

from inference.engine.peft_rules import CONFIG_FILE, WEIGHTS_FILE, ArchFingerprint, Check

from .. import objectstore, queue
from ..audit import SYSTEM_SWEEP, SYSTEM_VALIDATOR, audit_record
from ..errors import Conflict, ObjectMissing, UploadTooLarge
from ..models import Adapter, AdapterVersion, BaseModel
from ..objectstore import Digest
from ..staging import download_version
from ..uploads import CONFIG_FIELD, MAX_CONFIG_BYTES, WEIGHTS_FIELD, too_large
from ..validation import ValidationResult, printable, validate_adapter_files

log = logging.getLogger(__name__)


def _snapshot(version: AdapterVersion) -> dict:
    return {
        "number": version.number,
        "status": version.status,
        "config_sha256": version.config_sha256,
        "weights_sha256": version.weights_sha256,
        "size": version.size,
        "source": version.source,
    }


# ---------------------------------------------------------------- create


def _digest(f: BinaryIO, field: str, limit: int) -> Digest:
    try:
        return objectstore.hash_stream(objectstore.file_chunks(f), limit=limit)
    except UploadTooLarge:
        raise too_large(field, limit) from None


def _duplicate_of(adapter: Adapter, config: Digest, weights: Digest) -> AdapterVersion | None:
    """Identical bytes already uploaded (a version refused only for a storage fault doesn't count)."""
    return (
        AdapterVersion.objects.filter(
            adapter=adapter, config_sha256=config.sha256, weights_sha256=weights.sha256
        )
        .exclude(infra_failure=True)
        .order_by("number")
        .first()
    )


def _audit_duplicate(existing: AdapterVersion, *, actor: str, source: str) -> None:
    audit_record(
        tenant=existing.adapter.tenant,
        actor=actor,
        verb="version.upload_duplicate",
        object_type="adapter_version",
        object_repr=existing.label,
        after={"source": source, "duplicate_of": existing.number, "status": existing.status},
    )


def adapter_version_create(
    *, adapter: Adapter, config: BinaryIO, weights: BinaryIO, actor: str, source: str = "upload"
) -> tuple[AdapterVersion, bool]:
    """Store two local files as a new pending version and queue its validation.

    Returns (version, created); identical bytes return the existing version. On any failure
    the objects written so far are deleted: storage never keeps bytes no row refers to.
    """
    config_digest = _digest(config, CONFIG_FIELD, MAX_CONFIG_BYTES)
    weights_digest = _digest(weights, WEIGHTS_FIELD, settings.MAX_ADAPTER_BYTES)
    existing = _duplicate_of(adapter, config_digest, weights_digest)
    if existing is not None:
        _audit_duplicate(existing, actor=actor, source=source)
        return existing, False

    version = AdapterVersion(adapter=adapter, source=source, created_by=actor)
    prefix = f"adapters/{adapter.tenant_id}/{adapter.pk}/{version.uid.hex}"
    written: list[str] = []
    try:
        written.append(objectstore.save(f"{prefix}/{CONFIG_FILE}", config))
        written.append(objectstore.save(f"{prefix}/{WEIGHTS_FILE}", weights))
        with transaction.atomic():
            locked = Adapter.objects.select_for_update().get(pk=adapter.pk)
            existing = _duplicate_of(locked, config_digest, weights_digest)
            if existing is not None:  # a concurrent upload of the same bytes won
                transaction.on_commit(lambda: objectstore.delete_quietly(written))
                _audit_duplicate(existing, actor=actor, source=source)
                return existing, False
            last = locked.versions.aggregate(n=Max("number"))["n"] or 0
            version.number = last + 1
            version.config_key, version.weights_key = written
            version.config_sha256, version.config_size = config_digest.sha256, config_digest.size
            version.weights_sha256, version.weights_size = (
                weights_digest.sha256,
                weights_digest.size,
            )
            version.full_clean()
            version.save()
            audit_record(
                tenant=adapter.tenant,
                actor=actor,
                verb="version.upload",
                object_type="adapter_version",
                object_repr=version.label,
                after=_snapshot(version),
            )
            queue.send_on_commit(queue.VALIDATE, version.pk)
    except BaseException:
        objectstore.delete_quietly(written)
        raise
    return version, True


# ---------------------------------------------------------------- validate


def _start(version_id: int) -> AdapterVersion | None:
    with transaction.atomic():
        version = (
            AdapterVersion.objects.select_for_update()
            .select_related("adapter__tenant", "adapter__base_model")
            .filter(pk=version_id)
            .first()
        )
        if version is None or version.status in (AdapterVersion.READY, AdapterVersion.REJECTED):
            return None  # deleted, or already decided: a redelivered task has nothing to do
        if version.status == AdapterVersion.PENDING:
            version.status = AdapterVersion.VALIDATING
            version.attempts += 1
        version.validation_started_at = timezone.now()
        version.save(update_fields=["status", "attempts", "validation_started_at"])
        return version


def _int_or_none(value) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**31
    return value if ok else None


def _float_or_none(value) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and abs(value) < 1e300
    return float(value) if ok else None


def _targets(result: ValidationResult) -> list[str]:
    if result.spec is not None:
        return list(result.spec.target_modules)
    targets = result.config.get("target_modules")
    if isinstance(targets, str):
        targets = [targets]
    return (
        [t[:100] for t in targets[:50] if isinstance(t, str)] if isinstance(targets, list) else []
    )


def _finish(version_id: int, result: ValidationResult, *, revision: str) -> AdapterVersion | None:
    with transaction.atomic():
        version = (
            AdapterVersion.objects.select_for_update()
            .select_related("adapter__tenant", "adapter__base_model")
            .filter(pk=version_id)
            .first()
        )
        if version is None or version.status != AdapterVersion.VALIDATING:
            return None  # deleted meanwhile, or a concurrent run already decided
        before = _snapshot(version)
        version.status = AdapterVersion.READY if result.ok else AdapterVersion.REJECTED
        version.report = result.report()
        version.status_detail = result.summary()
        version.rank = _int_or_none(result.config.get("r"))
        version.alpha = _float_or_none(result.config.get("lora_alpha"))
        version.target_modules = printable(_targets(result))
        version.spec = printable(result.spec.to_dict()) if result.spec else None
        version.checked_revision = revision
        version.compatible = result.ok
        version.compatibility_detail = "" if result.ok else version.status_detail
        version.validated_at = timezone.now()
        version.full_clean()
        version.save()
        audit_record(
            tenant=version.adapter.tenant,
            actor=SYSTEM_VALIDATOR,
            verb=f"version.{version.status}",
            object_type="adapter_version",
            object_repr=version.label,
            before=before,
            after=_snapshot(version) | {"detail": version.status_detail},
        )
        if version.status == AdapterVersion.READY:
            queue.send_on_commit(queue.STAGE, version.pk)
            current = BaseModel.objects.get(pk=version.adapter.base_model_id).revision
            if current != revision:  # the base was re-imported while we were validating
                queue.send_on_commit(queue.RECHECK, version.adapter.base_model_id)
        return version


def adapter_version_validate(*, version_id: int) -> AdapterVersion | None:
    """Run every check on a version's stored files and record ready or rejected.

    Raises StorageUnavailable for the task to retry; a missing object rejects at once.
    """
    version = _start(version_id)
    if version is None:
        return None
    base = version.adapter.base_model
    try:
        with tempfile.TemporaryDirectory(prefix="loraplex-validate-") as tmp:
            integrity = download_version(version, Path(tmp))
            result = validate_adapter_files(
                Path(tmp) / CONFIG_FILE,
                Path(tmp) / WEIGHTS_FILE,
                fingerprint=ArchFingerprint.from_dict(base.fingerprint),
                max_lora_rank=settings.MAX_LORA_RANK,
                max_config_bytes=MAX_CONFIG_BYTES,
                max_weights_bytes=settings.MAX_ADAPTER_BYTES,
                base_model_name=base.name,
                prior_checks=[integrity],
            )
    except ObjectMissing as exc:
        return adapter_version_reject(version_id=version_id, reason=exc.message)
    return _finish(version_id, result, revision=base.revision)


def adapter_version_reject(
    *, version_id: int, reason: str, actor: str = SYSTEM_VALIDATOR
) -> AdapterVersion | None:
    """Reject for a reason outside the files (storage, a dead worker); re-validation may help."""
    with transaction.atomic():
        version = (
            AdapterVersion.objects.select_for_update()
            .select_related("adapter__tenant")
            .filter(pk=version_id)
            .first()
        )
        if version is None or version.status in (AdapterVersion.READY, AdapterVersion.REJECTED):
            return None
        before = _snapshot(version)
        version.status = AdapterVersion.REJECTED
        version.infra_failure = True
        version.report = [*version.report, Check("infrastructure", False, reason).to_dict()]
        version.status_detail = reason
        version.validated_at = timezone.now()
        version.save()
        audit_record(
            tenant=version.adapter.tenant,
            actor=actor,
            verb="version.rejected",
            object_type="adapter_version",
            object_repr=version.label,
            before=before,
            after=_snapshot(version) | {"detail": reason},
        )
        return version


@transaction.atomic
def adapter_version_revalidate(*, version: AdapterVersion, actor: str) -> AdapterVersion:
    """Start validation over (an operator's action after a fault). Ready versions stay ready."""
    version = AdapterVersion.objects.select_for_update().get(pk=version.pk)
    if version.status == AdapterVersion.READY:
        raise Conflict(f"{version.label} is ready; a ready version is immutable")
    before = _snapshot(version)
    version.status = AdapterVersion.PENDING
    version.attempts = 0
    version.infra_failure = False
    version.report, version.status_detail = [], ""
    version.validation_started_at = version.validated_at = None
    version.save()
    audit_record(
        tenant=version.adapter.tenant,
        actor=actor,
        verb="version.revalidate",
        object_type="adapter_version",
        object_repr=version.label,
        before=before,
        after=_snapshot(version),
    )
    queue.send_on_commit(queue.VALIDATE, version.pk)
    return version


# ---------------------------------------------------------------- sweep


def versions_sweep_stuck(*, now=None) -> dict[str, int]:
    """Re-queue validations that stopped without an answer (a worker died); give up after N.

    A version is stuck when it has been `validating` (or `pending`, its message lost) for
    longer than LORAPLEX_VALIDATION_DEADLINE_SECONDS. Each re-queue counts as an attempt.
    """
    now = now or timezone.now()
    deadline = now - timedelta(seconds=settings.VALIDATION_DEADLINE_SECONDS)
    stuck = AdapterVersion.objects.filter(
        Q(status=AdapterVersion.VALIDATING, validation_started_at__lt=deadline)
        | Q(status=AdapterVersion.PENDING, created_at__lt=deadline)
    ).values_list("pk", flat=True)
    counts = {"requeued": 0, "rejected": 0}
    for pk in list(stuck):
        with transaction.atomic():
            version = (
                AdapterVersion.objects.select_for_update()
                .select_related("adapter__tenant")
                .get(pk=pk)
            )
            if version.status not in (AdapterVersion.PENDING, AdapterVersion.VALIDATING):
                continue
            if version.attempts >= settings.VALIDATION_MAX_ATTEMPTS:
                reason = (
                    f"validation started {version.attempts} times and never finished (the worker "
                    "died or ran past its time limit); upload again or ask an operator to re-validate"
                )
                adapter_version_reject(version_id=pk, reason=reason, actor=SYSTEM_SWEEP)
                counts["rejected"] += 1
                continue
            version.status = AdapterVersion.VALIDATING
            version.attempts += 1
            version.validation_started_at = now
            version.save(update_fields=["status", "attempts", "validation_started_at"])
            audit_record(
                tenant=version.adapter.tenant,
                actor=SYSTEM_SWEEP,
                verb="version.requeue",
                object_type="adapter_version",
                object_repr=version.label,
                after={"attempt": version.attempts},
            )
            queue.send_on_commit(queue.VALIDATE, pk)
            counts["requeued"] += 1
    return counts
