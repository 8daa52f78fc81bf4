"""The version state machine: every move in ALLOWED works and is audited; every other move is
refused and changes nothing; redelivered tasks find nothing to do."""

import io
import itertools

import pytest

from audit.models import AuditEvent
from registry.errors import InvalidTransition
from registry.models import AdapterVersion
from registry.services.transitions import ALLOWED, transition
from registry.services.versions import (
    adapter_version_create,
    adapter_version_reject,
    adapter_version_revalidate,
    adapter_version_validate,
)
from tests.registry.conftest import ALICE_ACTOR

pytestmark = pytest.mark.django_db

Status = AdapterVersion.Status
MOVES = list(itertools.product(Status.values, repeat=2))


@pytest.fixture
def version_in(adapter):
    """version_in(status) -> a version row in that status (no files: moves don't read them)."""

    def make(status):
        return AdapterVersion.objects.create(
            adapter=adapter,
            number=AdapterVersion.objects.count() + 1,
            status=status,
            source="upload",
            config_key="c",
            weights_key="w",
            config_sha256="0" * 64,
            weights_sha256="0" * 64,
            config_size=1,
            weights_size=1,
            created_by=ALICE_ACTOR,
        )

    return make


def version_events():
    return AuditEvent.objects.filter(object_type="adapter_version")


def upload(adapter, folder):
    config = io.BytesIO((folder / "adapter_config.json").read_bytes())
    weights = io.BytesIO((folder / "adapter_model.safetensors").read_bytes())
    return adapter_version_create(
        adapter=adapter, config=config, weights=weights, actor=ALICE_ACTOR
    )[0]


def test_the_table_covers_every_status():
    assert set(ALLOWED) == set(Status.values)
    assert set().union(*ALLOWED.values()) <= set(Status.values)
    assert ALLOWED[Status.READY] == {Status.READY}  # nothing leaves ready


@pytest.mark.parametrize("start, to", [m for m in MOVES if m[1] in ALLOWED[m[0]]])
def test_an_allowed_move_changes_the_version_and_is_audited(version_in, start, to):
    version = version_in(start)
    moved = transition(version.pk, to, actor=ALICE_ACTOR, verb="test.move", status_detail="moved")
    version.refresh_from_db()
    assert moved.status == version.status == to and version.status_detail == "moved"
    event = AuditEvent.objects.get(verb="test.move")
    assert (event.before["status"], event.after["status"]) == (start, to)
    assert event.object_type == "adapter_version" and event.object_repr == version.label


@pytest.mark.parametrize("start, to", [m for m in MOVES if m[1] not in ALLOWED[m[0]]])
def test_a_move_outside_the_table_is_refused_and_changes_nothing(version_in, start, to):
    version = version_in(start)
    with pytest.raises(InvalidTransition) as refused:
        transition(version.pk, to, actor=ALICE_ACTOR, verb="test.move", status_detail="moved")
    assert refused.value.code == "invalid_transition"
    assert f"is {start}" in refused.value.message
    version.refresh_from_db()
    assert version.status == start and version.status_detail == ""
    assert not version_events().exists()


def test_a_ready_version_cannot_be_revalidated(version_in):
    version = version_in(Status.READY)
    with pytest.raises(InvalidTransition, match="is ready; a ready version is immutable"):
        adapter_version_revalidate(version=version, actor=ALICE_ACTOR)
    version.refresh_from_db()
    assert version.status == Status.READY
    assert not version_events().exists()


def test_a_rejected_version_is_revalidated_from_the_start(version_in):
    version = version_in(Status.REJECTED)
    AdapterVersion.objects.filter(pk=version.pk).update(
        attempts=3, infra_failure=True, status_detail="storage failed"
    )
    adapter_version_revalidate(version=version, actor=ALICE_ACTOR)
    version.refresh_from_db()
    assert version.status == Status.PENDING and version.attempts == 0
    assert not version.infra_failure and version.status_detail == ""
    event = AuditEvent.objects.get(verb="version.revalidate")
    assert event.before["detail"] == "storage failed" and event.after["status"] == "pending"


def test_changes_may_be_computed_from_the_locked_row(version_in):
    version = version_in(Status.PENDING)
    transition(
        version.pk,
        Status.VALIDATING,
        actor=ALICE_ACTOR,
        verb=None,
        attempts=lambda v: v.attempts + 1,
    )
    version.refresh_from_db()
    assert version.attempts == 1
    assert not version_events().exists()  # verb=None: not an event


def test_nothing_to_do_when_the_guard_fails_or_the_version_is_gone(version_in):
    version = version_in(Status.REJECTED)
    assert adapter_version_reject(version_id=version.pk, reason="again") is None  # decided
    assert transition(version.pk + 1000, Status.PENDING, actor=ALICE_ACTOR, verb="x") is None
    version.refresh_from_db()
    assert version.status_detail == "" and not version_events().exists()


def test_a_duplicate_validation_task_changes_nothing(adapter, good_adapter_dir):
    version = upload(adapter, good_adapter_dir)
    assert adapter_version_validate(version_id=version.pk).status == Status.READY
    version.refresh_from_db()
    events = AuditEvent.objects.count()

    assert adapter_version_validate(version_id=version.pk) is None  # redelivered
    again = AdapterVersion.objects.get(pk=version.pk)
    assert (again.status, again.attempts, again.validated_at) == (
        Status.READY,
        1,
        version.validated_at,
    )
    assert AuditEvent.objects.count() == events
