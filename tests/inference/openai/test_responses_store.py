"""Stored responses in the database: each tenant reads, continues and deletes only its own, a
response past LORAPLEX_RESPONSES_RETENTION_DAYS is never served, and the beat's purge
deletes those, and only those."""

from datetime import timedelta

import pytest
from django.utils import timezone

from inference.models import StoredResponse
from inference.openai.responses.store import (
    stored_conversation,
    stored_response_body,
    stored_response_delete,
    stored_response_save,
)
from inference.tasks import purge_expired_responses
from platform_site.celery import app as celery_app
from platform_site.errors import NotFound

pytestmark = pytest.mark.django_db
CONVERSATION = [
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi\x00"}]}
]


def save(tenant, n: int) -> str:
    response_id = f"resp_{n:032x}"
    body = {"id": response_id, "object": "response", "output": [], "metadata": {"k": "\x00"}}
    stored_response_save(tenant_id=tenant.id, body=body, conversation=CONVERSATION)
    return response_id


def age(response_id: str, days: float) -> None:
    past = timezone.now() - timedelta(days=days)
    StoredResponse.objects.filter(response_id=response_id).update(created_at=past)


def test_a_tenant_reads_its_own_and_never_anothers(tenant_a, tenant_b):
    mine = save(tenant_a, 1)
    assert stored_response_body(tenant=tenant_a, response_id=mine)["metadata"] == {"k": "\x00"}
    assert stored_conversation(tenant=tenant_a, response_id=mine) == CONVERSATION
    for read in (stored_response_body, stored_conversation):
        with pytest.raises(NotFound) as foreign:
            read(tenant=tenant_b, response_id=mine, param="previous_response_id")
        with pytest.raises(NotFound) as missing:
            read(tenant=tenant_b, response_id=f"resp_{2:032x}", param="previous_response_id")
        assert foreign.value.param == missing.value.param == "previous_response_id"
    with pytest.raises(NotFound):
        stored_response_delete(tenant=tenant_b, response_id=mine)
    assert stored_response_body(tenant=tenant_a, response_id=mine)["id"] == mine
    stored_response_delete(tenant=tenant_a, response_id=mine)
    with pytest.raises(NotFound):
        stored_response_body(tenant=tenant_a, response_id=mine)


@pytest.mark.parametrize("odd", ["resp_x", "resp_" + "0" * 31 + "\x00", "", "x" * 10_000])
def test_an_id_this_server_never_gives_names_nothing(tenant_a, odd):
    with pytest.raises(NotFound):
        stored_response_body(tenant=tenant_a, response_id=odd)
    with pytest.raises(NotFound):
        stored_response_delete(tenant=tenant_a, response_id=odd)


def test_a_response_past_its_retention_is_never_served(tenant_a, settings):
    settings.RESPONSES_RETENTION_DAYS = 30
    kept, expired = save(tenant_a, 1), save(tenant_a, 2)
    age(kept, 29)
    age(expired, 31)
    assert stored_response_body(tenant=tenant_a, response_id=kept)["id"] == kept
    for read in (stored_response_body, stored_conversation):
        with pytest.raises(NotFound):
            read(tenant=tenant_a, response_id=expired)
    with pytest.raises(NotFound):
        stored_response_delete(tenant=tenant_a, response_id=expired)
    settings.RESPONSES_RETENTION_DAYS = 28  # a shorter retention applies to what is stored
    with pytest.raises(NotFound):
        stored_response_body(tenant=tenant_a, response_id=kept)


def test_the_purge_deletes_what_is_past_its_retention_and_nothing_else(
    tenant_a, tenant_b, settings
):
    settings.RESPONSES_RETENTION_DAYS = 7
    fresh, old, other_old = save(tenant_a, 1), save(tenant_a, 2), save(tenant_b, 3)
    age(old, 8)
    age(other_old, 7.5)
    assert purge_expired_responses.apply().get() == 2
    assert set(StoredResponse.objects.values_list("response_id", flat=True)) == {fresh}
    assert purge_expired_responses.apply().get() == 0


def test_the_purge_runs_periodically_from_the_beat_schedule():
    from django.conf import settings as live

    schedule = live.CELERY_BEAT_SCHEDULE["inference-purge-expired-responses"]
    assert schedule["task"] == purge_expired_responses.name
    assert schedule["schedule"] > 0
    celery_app.loader.import_default_modules()
    assert purge_expired_responses.name in celery_app.tasks
