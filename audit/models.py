"""The audit trail: who did what to which of a tenant's objects, with the state before and after."""

from django.db import models


class AuditEvent(models.Model):
    """One change that matters to a tenant. Append-only: written by `audit_record`, never edited."""

    # By name: tenants records its changes here, so audit cannot import it.
    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.CASCADE, related_name="audit_events"
    )
    actor = models.CharField(max_length=100, help_text="user:<name>, key:<prefix> or system:<part>")
    verb = models.CharField(max_length=64)
    object_type = models.CharField(max_length=32)
    object_repr = models.CharField(max_length=200)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["tenant", "-created_at"], name="audit_tenant_time")]

    def __str__(self):
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.actor} {self.verb} {self.object_repr}"
