"""The serving layer's own table: the responses the Responses API keeps for a later request to
continue (`previous_response_id`) or read back, each its tenant's alone."""

from django.db import models
from django.utils import timezone


class StoredResponse(models.Model):
    """One answer of `POST /v1/responses` with `store` on, kept for
    LORAPLEX_RESPONSES_RETENTION_DAYS: the response as it was answered, and the conversation
    it ends (its input items, those of the responses it continued first, then its output)."""

    response_id = models.CharField(max_length=64, unique=True)
    # By name, as audit names it: the table belongs to the tenant, whose app sits below.
    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.CASCADE, related_name="stored_responses"
    )
    # JSON as text: never queried into, and a text may hold characters (NUL) that
    # PostgreSQL's jsonb refuses.
    body = models.TextField()
    conversation = models.TextField()
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    def __str__(self):
        return self.response_id
