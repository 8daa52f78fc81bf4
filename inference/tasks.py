"""Celery tasks of the serving layer: thin, each calls one function."""

from celery import shared_task

from .openai.responses.store import stored_responses_purge


@shared_task(name="inference.purge_expired_responses")
def purge_expired_responses() -> int:
    """Beat-scheduled: the stored responses past LORAPLEX_RESPONSES_RETENTION_DAYS deleted."""
    return stored_responses_purge()
