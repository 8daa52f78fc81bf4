"""Stored responses, each its tenant's alone: every read and write takes the tenant, and a
response of another tenant's is answered exactly as one that does not exist. A response is
kept LORAPLEX_RESPONSES_RETENTION_DAYS: past that it is never served, and the beat's purge
(inference/tasks.py) deletes it."""

import json
import re
from datetime import timedelta

from django.conf import settings
from django.db.models import QuerySet
from django.utils import timezone

from inference.models import StoredResponse
from platform_site.errors import NotFound

# The ids this server gives (answer.py); any other string names nothing stored.
RESPONSE_ID = re.compile(r"resp_[0-9a-f]{32}")


def stored_response_save(*, tenant_id: int, body: dict, conversation: list[dict]) -> None:
    StoredResponse.objects.create(
        response_id=body["id"],
        tenant_id=tenant_id,
        body=json.dumps(body),
        conversation=json.dumps(conversation),
    )


def stored_response_body(*, tenant, response_id: str, param: str | None = None) -> dict:
    return json.loads(_one(tenant, response_id, param).body)


def stored_conversation(*, tenant, response_id: str, param: str | None = None) -> list[dict]:
    """What a response continuing this one is shown first: its conversation, output last."""
    return json.loads(_one(tenant, response_id, param).conversation)


def stored_response_delete(*, tenant, response_id: str) -> None:
    deleted = 0
    if RESPONSE_ID.fullmatch(response_id):
        deleted, _ = _live(tenant).filter(response_id=response_id).delete()
    if not deleted:
        raise _not_found(response_id, None)


def stored_responses_purge() -> int:
    """Delete every response past its retention; how many there were."""
    deleted, _ = StoredResponse.objects.filter(created_at__lte=_cutoff()).delete()
    return deleted


def _one(tenant, response_id: str, param: str | None) -> StoredResponse:
    found = None
    if RESPONSE_ID.fullmatch(response_id):
        found = _live(tenant).filter(response_id=response_id).first()
    if found is None:
        raise _not_found(response_id, param)
    return found


def _live(tenant) -> QuerySet[StoredResponse]:
    return StoredResponse.objects.filter(tenant=tenant, created_at__gt=_cutoff())


def _cutoff():
    return timezone.now() - timedelta(days=settings.RESPONSES_RETENTION_DAYS)


def _not_found(response_id: str, param: str | None) -> NotFound:
    """The same words for a response never stored, expired, deleted or another tenant's."""
    return NotFound(
        f"No response {response_id[:80]!r} is stored for you (it may have expired, or was "
        "created with store: false).",
        param=param,
    )
