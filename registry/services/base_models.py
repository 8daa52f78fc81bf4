"""Base models: import a Hugging Face folder, and re-check adapters when its revision changes."""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
from pathlib import Path

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from audit.services import SYSTEM_COMPATIBILITY, SYSTEM_EVALUATOR, audit_record
from inference.engine.errors import ModelLoadError
from inference.engine.formats.safetensors_header import HeaderError, parse_header
from inference.engine.lora.peft_rules import (
    WEIGHTS_FILE,
    ArchFingerprint,
    Check,
    FingerprintError,
    fingerprint_from_config,
)
from inference.engine.quantization.tensors import check_checkpoint_tensors
from tenants.usage import usage_by_version

from .. import queue
from ..errors import ObjectMissing, RegistryError, StorageUnavailable
from ..models import AdapterVersion, BaseModel, Evaluation
from ..quality import short_revision
from ..staging import download_version, version_dir
from .evaluations import USAGE_WINDOW, evaluation_request
from .failures import log_unexpected
from .quality import quality_mark_pending, quality_move
from .transitions import transition, version_subject
from .versions import version_files_check

log = logging.getLogger(__name__)
RECHECK_VERB = "version.recheck"
_CHUNK = 4 * 1024 * 1024


def model_revision(folder: Path) -> str:
    """sha256 over config.json and every weight's name, dtype, shape and bytes.

    Tensors are hashed in name order, so re-sharding or reordering the same weights keeps
    the revision; changing one byte of one weight changes it.
    """
    folder = Path(folder)
    sha = hashlib.sha256()
    config = json.loads((folder / "config.json").read_text())
    sha.update(json.dumps(config, sort_keys=True, separators=(",", ":")).encode())
    tensors = []
    for file in sorted(folder.glob("*.safetensors")):
        header = parse_header(file)
        tensors += [(name, info, file, header.data_start) for name, info in header.tensors.items()]
    for name, info, file, data_start in sorted(tensors, key=lambda t: t[0]):
        sha.update(json.dumps([name, info.dtype, list(info.shape)]).encode())
        with open(file, "rb") as f:
            f.seek(data_start + info.begin)
            left = info.nbytes
            while left:
                chunk = f.read(min(_CHUNK, left))
                if not chunk:
                    raise HeaderError(f"{file.name} ends inside tensor {name!r}")
                sha.update(chunk)
                left -= len(chunk)
    return sha.hexdigest()


def read_model_folder(folder: Path) -> tuple[ArchFingerprint, str]:
    """(fingerprint, revision) of a Hugging Face folder the engine can serve, or RegistryError.

    The engine's own reading of config.json decides what is served (its architectures, rope
    types, sliding windows, quantization schemes, ...), so an import never registers a model
    `serve` would refuse; a quantized checkpoint's tensors must also be the ones its
    config.json declares.
    """
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise RegistryError(f"{folder} has no config.json; is it a Hugging Face model folder?")
    if not any(folder.glob("*.safetensors")):
        raise RegistryError(
            f"{folder} has no .safetensors weights (pickled .bin weights are not accepted)"
        )
    try:
        raw = json.loads((folder / "config.json").read_text())
    except (UnicodeDecodeError, ValueError) as exc:
        raise RegistryError(f"{folder}/config.json is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise RegistryError(f"{folder}/config.json must hold a JSON object")
    architecture = _served_architecture(raw, source=f"{folder}/config.json")
    try:
        # The fingerprint describes the architecture the engine runs, should config.json
        # list several.
        fingerprint = fingerprint_from_config(raw | {"architectures": [architecture]})
        if fingerprint.quantization is not None:
            check_checkpoint_tensors(fingerprint.quantization, fingerprint, _tensors(folder))
        return fingerprint, model_revision(folder)
    except (FingerprintError, HeaderError, ValueError) as exc:
        raise RegistryError(f"{folder}: {exc}") from exc


def _tensors(folder: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Every weight's (dtype, shape), from the safetensors headers alone."""
    found = {}
    for file in sorted(folder.glob("*.safetensors")):
        for name, info in parse_header(file).tensors.items():
            found[name] = (info.dtype, tuple(info.shape))
    return found


def _served_architecture(raw: dict, *, source: str) -> str:
    """The architecture the engine will run a config.json as; RegistryError naming what the
    engine serves when it would refuse it.

    The engine's config module imports torch: it is imported here, when an operator imports
    a model, not when the registry loads (its workers validate uploads without torch).
    """
    from inference.engine.config import ModelConfig

    try:
        return ModelConfig.from_dict(raw, source=source).architecture
    except ModelLoadError as exc:
        raise RegistryError(f"the engine cannot serve this model: {exc}") from None
    except (ValueError, TypeError) as exc:  # int() of a value of the wrong type
        raise RegistryError(f"{source} holds a value of the wrong type: {exc}") from None


@transaction.atomic
def base_model_import(
    *, name: str, path: Path, default: bool | None = None
) -> tuple[BaseModel, bool]:
    """Record (or update) a base model; returns (row, revision_changed).

    A changed revision makes every adapter on it unservable until the compatibility
    re-check, queued here, has checked it against the new weights and its re-evaluation
    there has passed (quality pending meanwhile). `default=None` makes it the default base
    model when there is none yet.
    """
    path = Path(path).resolve()
    fingerprint, revision = read_model_folder(path)
    row = BaseModel.objects.select_for_update().filter(name=name).first()
    changed = row is not None and row.revision != revision
    if row is None:
        row = BaseModel(name=name)
    row.revision, row.fingerprint, row.local_path = revision, fingerprint.to_dict(), str(path)
    # A quantized checkpoint of the same weights is a new revision like any other (its
    # config.json and tensors differ): adapters on it are re-checked and re-evaluated.
    row.quantization = fingerprint.quantization.name if fingerprint.quantization else ""
    if default is None:
        default = row.is_default or not BaseModel.objects.filter(is_default=True).exists()
    if default:
        BaseModel.objects.filter(is_default=True).exclude(pk=row.pk).update(is_default=False)
    row.is_default = default
    row.full_clean()
    row.save()
    if changed:
        # The quality gate: nothing on it serves until re-checked and re-evaluated there.
        quality_mark_pending(
            base_model=row,
            detail=(
                f"evaluation pending on revision {short_revision(revision)}: {row.name} was "
                "re-imported; its compatibility is re-checked, then it is re-evaluated"
            ),
        )
        queue.send_on_commit(queue.RECHECK, row.pk)
    return row, changed


def version_recheck(*, version: AdapterVersion, base_model: BaseModel) -> AdapterVersion | None:
    """Check one ready version's files against the base model's current fingerprint.

    Reads the staged copy when this host has one, else the object (StorageUnavailable
    propagates for the task to retry). Values were checked at validation; shapes are what
    a new base can break, so only the header is read here. None if the version is gone.
    """
    if version.checked_revision == base_model.revision:
        return version
    with tempfile.TemporaryDirectory(prefix="loraplex-recheck-") as tmp:
        folder = version_dir(version)
        prior = []
        if not (folder / WEIGHTS_FILE).is_file():
            folder = Path(tmp)
            try:
                prior = [download_version(version, folder)]
            except ObjectMissing as exc:
                prior = [Check("sha256", False, exc.message)]
        result = version_files_check(folder, base_model=base_model, prior=prior, check_values=False)
    checked = transition(
        version.pk,
        AdapterVersion.Status.READY,
        actor=SYSTEM_COMPATIBILITY,
        verb="version.compatible" if result.ok else "version.incompatible",
        checked_revision=base_model.revision,
        compatible=result.ok,
        compatibility_detail=(
            f"fits revision {base_model.revision[:12]}" if result.ok else result.summary()
        ),
    )
    if checked is not None and not result.ok:
        _not_evaluated(checked, base_model, f"it does not fit: {result.summary()}")
    return checked


def _not_evaluated(version: AdapterVersion, base_model: BaseModel, why: str) -> None:
    """An incompatible version is not evaluated on this revision: its quality says so."""
    quality_move(
        version.pk,
        AdapterVersion.Quality.FAILED,
        revision=base_model.revision,
        detail=f"not evaluated on revision {short_revision(base_model.revision)}: {why}",
        actor=SYSTEM_COMPATIBILITY,
        verb=None,
    )


def _unchecked(base_model: BaseModel) -> QuerySet[AdapterVersion]:
    """Ready versions on `base_model` not checked against its current revision."""
    return (
        AdapterVersion.objects.filter(adapter__base_model=base_model, status=AdapterVersion.READY)
        .exclude(checked_revision=base_model.revision)
        .select_related("adapter__tenant")
    )


@transaction.atomic
def base_model_recheck_request(*, base_model: BaseModel, actor: str) -> int:
    """An operator's re-check of the versions on `base_model` (after a fault, say): each one
    the re-check will look at is audited in its tenant's trail, and the re-check is queued
    once this commits. Returns how many versions it will look at."""
    versions = list(_unchecked(base_model))
    for version in versions:
        audit_record(
            subject=version_subject(version),
            actor=actor,
            verb=RECHECK_VERB,
            before={"revision": version.checked_revision, "compatible": version.compatible},
            after={"base_model": base_model.name, "revision": base_model.revision},
        )
    queue.send_on_commit(queue.RECHECK, base_model.pk)
    return len(versions)


def base_model_recheck(*, base_model_id: int) -> dict[str, int]:
    """Re-check every ready version on this base model against its current revision, most
    used first, and queue the re-evaluation of each compatible one as soon as it is checked
    (so the evaluations run most used first too)."""
    base_model = BaseModel.objects.get(pk=base_model_id)
    versions = list(_unchecked(base_model))
    usage = usage_by_version(
        version_ids=[v.pk for v in versions], since=timezone.now() - USAGE_WINDOW
    )
    versions.sort(key=lambda v: (-usage.get(v.pk, 0), v.pk))
    counts = {"compatible": 0, "incompatible": 0}
    for version in versions:
        try:
            checked = version_recheck(version=version, base_model=base_model)
        except StorageUnavailable:
            raise  # the task retries; the versions checked so far stay checked
        except Exception as exc:  # a bug: this version is unchecked, the others still get theirs
            checked = _recheck_failed(version, base_model, exc)
        if checked is not None:
            counts["compatible" if checked.compatible else "incompatible"] += 1
            if checked.compatible:
                evaluation_request(
                    version_id=checked.pk,
                    trigger=Evaluation.Trigger.BASE_UPGRADE,
                    actor=SYSTEM_EVALUATOR,
                )
    return counts


def _recheck_failed(
    version: AdapterVersion, base_model: BaseModel, exc: Exception
) -> AdapterVersion | None:
    """Not checked against this revision (so not servable on it), saying why.

    `checked_revision` stays the old one: the admin's re-check action tries it again.
    """
    error_id = log_unexpected(exc, what=f"re-checking version {version.pk}")
    detail = (
        f"the check against revision {base_model.revision[:12]} failed on an internal "
        f"error (error id {error_id}); an operator can re-check once it is fixed"
    )
    failed = transition(
        version.pk,
        AdapterVersion.Status.READY,
        actor=SYSTEM_COMPATIBILITY,
        verb="version.incompatible",
        compatible=False,
        compatibility_detail=detail,
    )
    if failed is not None:
        _not_evaluated(failed, base_model, detail)
    return failed
