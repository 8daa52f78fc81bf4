"""Eval sets: a tenant's own for an adapter, the operator's generic one for a base model.

Everything is read and validated (registry/eval_sets.py) before anything is stored; then the
object is written, then the row in a transaction, and the object is deleted again if the row
is not: nothing is ever half-stored. Rows never change (see EvalSet): replacing a set makes a
new current row, and superseded rows nothing refers to go with their objects. Changes to an
adapter's set are audited; a base model's, which no tenant owns, are logged.
"""

from __future__ import annotations

import hashlib
import io
import logging
from dataclasses import dataclass
from typing import BinaryIO

from django.conf import settings
from django.db import transaction
from django.db.models import ProtectedError, RestrictedError

from audit.services import Subject, audit_record

from .. import objectstore
from ..eval_sets import EvalRow, parse_eval_set
from ..models import Adapter, BaseModel, EvalSet
from ..objectstore import Digest
from ..uploads import EVAL_SET_FIELD
from .evaluations import versions_measure_unmeasured

log = logging.getLogger(__name__)
ATTACH_VERB = "eval_set.attach"
EVAL_SET_FILE = "eval_set.jsonl"


@dataclass(frozen=True)
class CheckedEvalSet:
    """An eval set read and validated, not stored yet."""

    data: bytes
    digest: Digest
    rows: list[EvalRow]


def eval_set_check(file: BinaryIO, *, param: str = EVAL_SET_FIELD) -> CheckedEvalSet:
    """Read an eval set (at most LORAPLEX_EVAL_MAX_BYTES, then refused) and validate every row
    (and their tokens to score: at most LORAPLEX_EVAL_MAX_TOKENS).

    Stores nothing; raises InvalidEvalSet (the line and field named) or UploadTooLarge.
    `param` is the request field the file came in, for the error.
    """
    file.seek(0)
    data = file.read(settings.EVAL_MAX_BYTES + 1)
    rows = parse_eval_set(
        data,
        max_rows=settings.EVAL_MAX_ROWS,
        max_bytes=settings.EVAL_MAX_BYTES,
        max_tokens=settings.EVAL_MAX_TOKENS,
        param=param,
    )
    return CheckedEvalSet(data, Digest(hashlib.sha256(data).hexdigest(), len(data)), rows)


# ---------------------------------------------------------------- storing


def _owner(owner: Adapter | BaseModel) -> dict:
    return {"adapter": owner} if isinstance(owner, Adapter) else {"base_model": owner}


def _current(owner: Adapter | BaseModel) -> EvalSet | None:
    return EvalSet.objects.filter(**_owner(owner), is_current=True).first()


def _object_key(owner: Adapter | BaseModel, eval_set: EvalSet) -> str:
    """Next to the adapter's versions (under its tenant's prefix), or under the base model."""
    if isinstance(owner, Adapter):
        prefix = f"adapters/{owner.tenant_id}/{owner.pk}/eval-sets"
    else:
        prefix = f"base-models/{owner.pk}/eval-sets"
    return f"{prefix}/{eval_set.uid.hex}/{EVAL_SET_FILE}"


def _summary(eval_set: EvalSet | None) -> dict | None:
    if eval_set is None:
        return None
    return {"sha256": eval_set.sha256, "rows": eval_set.rows, "size": eval_set.size}


def eval_set_upload(*, owner: Adapter | BaseModel, checked: CheckedEvalSet) -> EvalSet:
    """Write a checked set's object; returns its row, not saved yet (`eval_set_record` does).

    The caller deletes `key` again if the row is never saved.
    """
    eval_set = EvalSet(
        **_owner(owner),
        sha256=checked.digest.sha256,
        size=checked.digest.size,
        rows=len(checked.rows),
    )
    eval_set.key = objectstore.save(_object_key(owner, eval_set), io.BytesIO(checked.data))
    return eval_set


def eval_set_record(eval_set: EvalSet, *, actor: str) -> tuple[EvalSet, bool]:
    """Make an uploaded set its owner's current one, in the caller's transaction.

    Returns (the current set, created). The same bytes as the current set change nothing:
    (current, False), and the uploaded object is deleted once the transaction commits.
    """
    owner: Adapter | BaseModel
    if eval_set.adapter_id is not None:
        # The adapter row alone: adapter_version_create locks its tenant first, then it.
        owner = Adapter.objects.select_for_update().get(pk=eval_set.adapter_id)
    else:
        assert eval_set.base_model_id is not None  # the model's check constraint: one owner
        owner = BaseModel.objects.select_for_update().get(pk=eval_set.base_model_id)
    previous = _current(owner)
    if previous is not None and previous.sha256 == eval_set.sha256:
        key = eval_set.key
        transaction.on_commit(lambda: objectstore.delete_quietly([key]))
        return previous, False
    if previous is not None:
        previous.is_current = False
        previous.save(update_fields=["is_current"])
    eval_set.is_current = True
    eval_set.created_by = actor
    eval_set.full_clean()
    eval_set.save()
    if isinstance(owner, Adapter):
        audit_record(
            subject=Subject(tenant=owner.tenant, type="adapter", name=owner.name),
            actor=actor,
            verb=ATTACH_VERB,
            before=_summary(previous),
            after=_summary(eval_set),
        )
    else:
        log.info(
            "generic eval set of %s is now %s (%d rows, %d bytes), by %s",
            owner.name,
            eval_set.sha256[:12],
            eval_set.rows,
            eval_set.size,
            actor,
        )
    _prune_superseded(owner)
    # Versions accepted unmeasured (there was no eval set then) are measured on this one now.
    versions_measure_unmeasured(eval_set=eval_set, actor=actor)
    return eval_set, True


def _prune_superseded(owner: Adapter | BaseModel) -> None:
    """Delete the owner's superseded sets, and their objects after the commit, unless a row
    still refers to one (a PROTECT or RESTRICT foreign key): those bytes stay as they were."""
    gone = []
    for old in EvalSet.objects.filter(**_owner(owner), is_current=False):
        try:
            with transaction.atomic():
                old.delete()
        except (ProtectedError, RestrictedError):
            continue
        gone.append(old.key)
    if gone:
        transaction.on_commit(lambda: objectstore.delete_quietly(gone))


def eval_set_store(
    *, owner: Adapter | BaseModel, checked: CheckedEvalSet, actor: str
) -> tuple[EvalSet, bool]:
    """Store a checked set and make it its owner's current one: (set, created)."""
    current = _current(owner)
    if current is not None and current.sha256 == checked.digest.sha256:
        return current, False  # identical bytes: nothing to store
    uploaded = eval_set_upload(owner=owner, checked=checked)
    try:
        with transaction.atomic():
            return eval_set_record(uploaded, actor=actor)
    except BaseException:
        objectstore.delete_quietly([uploaded.key])
        raise


def eval_set_attach(
    *, adapter: Adapter, file: BinaryIO, actor: str, param: str = EVAL_SET_FIELD
) -> tuple[EvalSet, bool]:
    """Make `file` the adapter's own eval set (replacing the one it had); audited.

    Returns (set, created): identical bytes to the current set return it with False.
    Refuses a bad set (InvalidEvalSet, UploadTooLarge) before storing anything.
    """
    checked = eval_set_check(file, param=param)
    return eval_set_store(owner=adapter, checked=checked, actor=actor)


def eval_set_attach_default(
    *, base_model: BaseModel, file: BinaryIO, actor: str
) -> tuple[EvalSet, bool]:
    """The operator's generic eval set for adapters of `base_model` without their own."""
    checked = eval_set_check(file)
    return eval_set_store(owner=base_model, checked=checked, actor=actor)
