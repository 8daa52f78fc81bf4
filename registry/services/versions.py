"""Adapter versions: create from two files, validate, reject, re-validate, re-stage, sweep.

Every status change goes through `transitions.transition` (row lock, ALLOWED, audit) and is
idempotent, so a redelivered or duplicated task is harmless.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import BinaryIO

from django.conf import settings
from django.db import transaction
from django.db.models import Max, Q
from django.utils import timezone

from audit.services import SYSTEM_EVALUATOR, SYSTEM_SWEEP, SYSTEM_VALIDATOR, audit_record
from inference.engine.lora.peft_rules import CONFIG_FILE, WEIGHTS_FILE, ArchFingerprint, Check
from tenants.models import Tenant

from .. import objectstore, queue
from ..announcements import announce_on_commit
from ..errors import ObjectMissing, UploadTooLarge
from ..models import Adapter, AdapterVersion, BaseModel, EvalSet, Evaluation
from ..objectstore import Digest
from ..staging import download_version
from ..uploads import CONFIG_FIELD, EVAL_FIELD, MAX_CONFIG_BYTES, WEIGHTS_FIELD, too_large
from ..validation import ValidationResult, printable, validate_adapter_files
from .eval_sets import (
    CheckedEvalSet,
    eval_set_check,
    eval_set_record,
    eval_set_store,
    eval_set_upload,
)
from .evaluations import evaluation_request
from .failures import log_unexpected
from .quotas import UPLOAD_VERB, quota_check
from .transitions import (
    locked_version,
    transition,
    undecided,
    version_snapshot,
    version_subject,
)

log = logging.getLogger(__name__)
Status = AdapterVersion.Status
RESTAGE_VERB = "version.restage"


# ---------------------------------------------------------------- create


def _digest(f: BinaryIO, field: str, limit: int) -> Digest:
    try:
        return objectstore.hash_stream(objectstore.file_chunks(f), limit=limit)
    except UploadTooLarge:
        raise too_large(field, limit) from None


def _duplicate_of(
    adapter: Adapter, config_sha256: str, weights_sha256: str
) -> AdapterVersion | None:
    """Identical bytes already uploaded (not a version refused only for a storage fault)."""
    return (
        AdapterVersion.objects.filter(
            adapter=adapter, config_sha256=config_sha256, weights_sha256=weights_sha256
        )
        .exclude(infra_failure=True)
        .order_by("number")
        .first()
    )


def _audit_duplicate(existing: AdapterVersion, *, actor: str, source: str) -> None:
    audit_record(
        subject=version_subject(existing),
        actor=actor,
        verb="version.upload_duplicate",
        after={"source": source, "duplicate_of": existing.number, "status": existing.status},
    )


def adapter_version_create(
    *,
    adapter: Adapter,
    config: BinaryIO,
    weights: BinaryIO,
    actor: str,
    source: str = AdapterVersion.FROM_UPLOAD,
    operator_source: str = "",
    eval_set: BinaryIO | None = None,
) -> tuple[AdapterVersion, bool]:
    """Store two local files as a new pending version and queue its validation.

    `source` is what the tenant sees of the files' origin; `operator_source`, where an
    operator's files were read from, only operators see (the registry's admin).

    Returns (version, created); identical bytes return the existing version. The tenant's
    quotas are checked before storing and again under its row lock (QuotaExceeded). On any
    failure the objects written so far are deleted: storage never keeps bytes no row refers to.
    `eval_set` (the upload's `eval` part) becomes the adapter's eval set in the same
    transaction; it is validated first, so a bad one refuses the upload with nothing stored.
    """
    checked_eval = eval_set_check(eval_set, param=EVAL_FIELD) if eval_set is not None else None
    config_digest = _digest(config, CONFIG_FIELD, MAX_CONFIG_BYTES)
    weights_digest = _digest(weights, WEIGHTS_FIELD, settings.MAX_ADAPTER_BYTES)
    existing = _duplicate_of(adapter, config_digest.sha256, weights_digest.sha256)
    if existing is not None:
        if checked_eval is not None:  # the version exists; the eval set is still the adapter's
            eval_set_store(owner=adapter, checked=checked_eval, actor=actor)
        _audit_duplicate(existing, actor=actor, source=source)
        return existing, False
    quota_check(tenant=adapter.tenant, new_bytes=config_digest.size + weights_digest.size)

    version = AdapterVersion(
        adapter=adapter, source=source, operator_source=operator_source, created_by=actor
    )
    version.config_sha256, version.config_size = config_digest.sha256, config_digest.size
    version.weights_sha256, version.weights_size = weights_digest.sha256, weights_digest.size
    written: list[str] = []
    try:
        uploaded_eval = _store_objects(version, config, weights, checked_eval, written=written)
        return _record_new(version, uploaded_eval, actor=actor)
    except BaseException:
        objectstore.delete_quietly(written)
        raise


def _store_objects(
    version: AdapterVersion,
    config: BinaryIO,
    weights: BinaryIO,
    checked_eval: CheckedEvalSet | None,
    *,
    written: list[str],
) -> EvalSet | None:
    """Write the version's files (and the upload's eval set, returned unsaved) to object
    storage, adding each key to `written` as it lands, for the caller to delete on failure."""
    adapter = version.adapter
    prefix = f"adapters/{adapter.tenant_id}/{adapter.pk}/{version.uid.hex}"
    version.config_key = objectstore.save(f"{prefix}/{CONFIG_FILE}", config)
    written.append(version.config_key)
    version.weights_key = objectstore.save(f"{prefix}/{WEIGHTS_FILE}", weights)
    written.append(version.weights_key)
    if checked_eval is None:
        return None
    uploaded_eval = eval_set_upload(owner=adapter, checked=checked_eval)
    written.append(uploaded_eval.key)
    return uploaded_eval


@transaction.atomic
def _record_new(
    version: AdapterVersion, uploaded_eval: EvalSet | None, *, actor: str
) -> tuple[AdapterVersion, bool]:
    """Save the stored version as its adapter's next number, under the tenant's and the
    adapter's row locks, unless the same bytes won meanwhile: (the winner, False)."""
    adapter = version.adapter
    # The tenant first: its quotas count versions of all its adapters.
    tenant = Tenant.objects.select_for_update().get(pk=adapter.tenant_id)
    locked = Adapter.objects.select_for_update().get(pk=adapter.pk)
    if uploaded_eval is not None:
        eval_set_record(uploaded_eval, actor=actor)
    existing = _duplicate_of(locked, version.config_sha256, version.weights_sha256)
    if existing is not None:  # a concurrent upload of the same bytes won
        keys = [version.config_key, version.weights_key]
        transaction.on_commit(lambda: objectstore.delete_quietly(keys))
        _audit_duplicate(existing, actor=actor, source=version.source)
        return existing, False
    quota_check(tenant=tenant, new_bytes=version.size)
    version.number = (locked.versions.aggregate(n=Max("number"))["n"] or 0) + 1
    version.full_clean()
    version.save()
    audit_record(
        subject=version_subject(version),
        actor=actor,
        verb=UPLOAD_VERB,
        after=version_snapshot(version),
    )
    queue.send_on_commit(queue.VALIDATE, version.pk)
    return version, True


# ---------------------------------------------------------------- validate


def _start(version_id: int) -> AdapterVersion | None:
    """Mark a run started; None when the version is gone or already decided (nothing to do)."""
    return transition(
        version_id,
        Status.VALIDATING,
        actor=SYSTEM_VALIDATOR,
        verb=None,  # the verdict is the event; a start is not
        when=undecided,
        # A run the sweep re-queued (already validating) was counted when it was re-queued.
        attempts=lambda v: v.attempts + 1 if v.status == Status.PENDING else v.attempts,
        validation_started_at=timezone.now(),
    )


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


def _rank(result: ValidationResult) -> int | None:
    """The largest rank of any module (a `rank_pattern` may raise some above `r`): what a
    device slot must hold. Before a spec, the config's `r` as far as it is a number."""
    if result.spec is not None:
        return max(result.spec.max_rank, result.spec.rank)
    return _int_or_none(result.config.get("r"))


def _finish(version_id: int, result: ValidationResult, *, revision: str) -> AdapterVersion | None:
    verdict = Status.READY if result.ok else Status.REJECTED
    detail = result.summary()
    version = transition(
        version_id,
        verdict,
        actor=SYSTEM_VALIDATOR,
        verb=f"version.{verdict.value}",
        when=lambda v: v.status == Status.VALIDATING,  # else deleted, or another run decided
        report=result.report(),
        status_detail=detail,
        rank=_rank(result),
        alpha=_float_or_none(result.config.get("lora_alpha")),
        target_modules=printable(_targets(result)),
        spec=printable(result.spec.to_dict()) if result.spec else None,
        checked_revision=revision,
        compatible=result.ok,
        compatibility_detail="" if result.ok else detail,
        validated_at=timezone.now(),
    )
    if version is not None and version.status == Status.READY:
        base_model_id = version.adapter.base_model_id
        if BaseModel.objects.get(pk=base_model_id).revision != revision:
            queue.send_on_commit(queue.RECHECK, base_model_id)  # re-imported while we validated
        else:  # the quality gate: servable once evaluated (the re-check requests it otherwise)
            evaluation_request(
                version_id=version.pk, trigger=Evaluation.Trigger.UPLOAD, actor=SYSTEM_EVALUATOR
            )
            version.refresh_from_db()
        queue.send_on_commit(queue.STAGE, version.pk)
        announce_on_commit(version)  # the engine replicas stage it too
    return version


def version_files_check(
    folder: Path, *, base_model: BaseModel, prior: Sequence[Check], check_values: bool = True
) -> ValidationResult:
    """A version's two files in `folder` checked against `base_model` under this deployment's
    limits: whole at validation, the header alone when the base model's revision changes."""
    return validate_adapter_files(
        folder / CONFIG_FILE,
        folder / WEIGHTS_FILE,
        fingerprint=ArchFingerprint.from_dict(base_model.fingerprint),
        max_lora_rank=settings.MAX_LORA_RANK,
        max_saved_params=settings.MAX_SAVED_MODULE_PARAMS,
        max_config_bytes=MAX_CONFIG_BYTES,
        max_weights_bytes=settings.MAX_ADAPTER_BYTES,
        base_model_name=base_model.name,
        check_values=check_values,
        prior_checks=prior,
    )


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
            result = version_files_check(Path(tmp), base_model=base, prior=[integrity])
    except ObjectMissing as exc:
        return adapter_version_reject(version_id=version_id, reason=exc.message)
    return _finish(version_id, result, revision=base.revision)


def adapter_version_reject(
    *,
    version_id: int,
    reason: str,
    actor: str = SYSTEM_VALIDATOR,
    when: Callable[[AdapterVersion], bool] = undecided,
    check: str = "infrastructure",
) -> AdapterVersion | None:
    """Reject for a reason outside the files (storage, a dead worker); re-validation may help.

    None when the version is gone or `when` is false (by default: it is already decided).
    """
    return transition(
        version_id,
        Status.REJECTED,
        actor=actor,
        verb="version.rejected",
        when=when,
        infra_failure=True,
        report=lambda v: [*v.report, Check(check, False, reason).to_dict()],
        status_detail=reason,
        validated_at=timezone.now(),
    )


def adapter_version_fail(*, version_id: int, exc: BaseException) -> AdapterVersion | None:
    """Reject after an unexpected exception: a bug of ours, not a rule the files broke.

    The traceback is logged under an error id that the reason quotes; the version counts as an
    infrastructure failure, so the same bytes may be uploaded again, or re-validated once fixed.
    """
    error_id = log_unexpected(exc, what=f"validation of version {version_id}")
    reason = (
        f"the validator failed on an internal error (error id {error_id}); quote the id to an "
        "operator, who can re-validate the version once it is fixed"
    )
    return adapter_version_reject(version_id=version_id, reason=reason, check="validator")


@transaction.atomic
def adapter_version_revalidate(*, version: AdapterVersion, actor: str) -> AdapterVersion | None:
    """Start validation over (an operator's action after a fault). Ready versions stay ready."""
    revalidated = transition(
        version.pk,
        Status.PENDING,
        actor=actor,
        verb="version.revalidate",
        attempts=0,
        infra_failure=False,
        report=[],
        status_detail="",
        validation_started_at=None,
        validated_at=None,
    )
    if revalidated is not None:
        queue.send_on_commit(queue.VALIDATE, revalidated.pk)
    return revalidated


@transaction.atomic
def adapter_version_restage(*, version: AdapterVersion, actor: str) -> AdapterVersion | None:
    """Stage a ready version into the adapter cache again (an operator's action, after the
    cache lost it, say): audited, staged by the worker once this commits. None when it is
    gone or not ready: only ready versions are staged."""
    ready = locked_version(version.pk, when=lambda v: v.status == Status.READY)
    if ready is None:
        return None
    audit_record(subject=version_subject(ready), actor=actor, verb=RESTAGE_VERB)
    queue.send_on_commit(queue.STAGE, ready.pk)
    return ready


# ---------------------------------------------------------------- sweep


def versions_sweep_stuck(*, now=None) -> dict[str, int]:
    """Re-queue validations that stopped without an answer (a worker died); give up after N.

    A version is stuck when it has been `validating` (or `pending`, its message lost) for
    longer than LORAPLEX_VALIDATION_DEADLINE_SECONDS. Each re-queue counts as an attempt.
    """
    now = now or timezone.now()
    deadline = now - timedelta(seconds=settings.VALIDATION_DEADLINE_SECONDS)
    stuck = AdapterVersion.objects.filter(
        Q(status=Status.VALIDATING, validation_started_at__lt=deadline)
        | Q(status=Status.PENDING, created_at__lt=deadline)
    ).values_list("pk", "attempts")
    counts = {"requeued": 0, "rejected": 0}
    for pk, attempts in list(stuck):
        if attempts < settings.VALIDATION_MAX_ATTEMPTS:
            counts["requeued"] += _requeue(pk, now=now) is not None
        else:
            counts["rejected"] += _give_up(pk, attempts=attempts) is not None
    return counts


def _requeue(version_id: int, *, now) -> AdapterVersion | None:
    version = transition(
        version_id,
        Status.VALIDATING,
        actor=SYSTEM_SWEEP,
        verb="version.requeue",
        when=lambda v: undecided(v) and v.attempts < settings.VALIDATION_MAX_ATTEMPTS,
        attempts=lambda v: v.attempts + 1,
        validation_started_at=now,
    )
    if version is not None:
        queue.send_on_commit(queue.VALIDATE, version_id)
    return version


def _give_up(version_id: int, *, attempts: int) -> AdapterVersion | None:
    reason = (
        f"validation started {attempts} times and never finished (the worker died or ran past "
        "its time limit); upload again or ask an operator to re-validate"
    )
    return adapter_version_reject(
        version_id=version_id,
        reason=reason,
        actor=SYSTEM_SWEEP,
        when=lambda v: undecided(v) and v.attempts >= settings.VALIDATION_MAX_ATTEMPTS,
    )
