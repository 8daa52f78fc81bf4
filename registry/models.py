"""Base models, tenants' adapters, their immutable versions and aliases (rollouts).

Rows are changed only through `registry.services`; reads go through `registry.selectors`,
which is where tenant isolation lives.
"""

import uuid

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from tenants.models import Tenant

from .names import adapter_name_validator, alias_name_validator, base_model_name_validator


class BaseModel(models.Model):
    """A base model this deployment knows; at most one is served (kept resident by the engine)."""

    name = models.CharField(max_length=100, unique=True, validators=[base_model_name_validator])
    revision = models.CharField(
        max_length=64, help_text="sha256 over config.json and every weight's name, shape and bytes"
    )
    fingerprint = models.JSONField(help_text="ArchFingerprint.to_dict(): the shapes adapters fit")
    local_path = models.CharField(max_length=1000)
    is_served = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(
                fields=["is_served"], condition=Q(is_served=True), name="one_served_base_model"
            )
        ]
        # registry/permissions.py: staff alone may not touch the engines.
        permissions = [("operate_engines", "Can load, pin and unpin adapters on the engines")]

    def __str__(self):
        return f"{self.name}@{self.revision[:12]}"


class Adapter(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="adapters")
    name = models.CharField(max_length=63, validators=[adapter_name_validator])
    base_model = models.ForeignKey(BaseModel, on_delete=models.PROTECT, related_name="adapters")
    description = models.TextField(blank=True, max_length=2000)
    created_by = models.CharField(max_length=100)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tenant__slug", "name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="adapter_name_unique_in_tenant")
        ]

    def __str__(self):
        return f"{self.tenant.slug}/{self.name}"


class AdapterVersion(models.Model):
    """One upload. Its bytes never change (sha256 recorded); its status moves only as
    `registry.services.transitions.ALLOWED` says."""

    class Status(models.TextChoices):
        # Labels are the values: pages, the admin and the API all show the same word.
        PENDING = "pending", "pending"
        VALIDATING = "validating", "validating"
        READY = "ready", "ready"
        REJECTED = "rejected", "rejected"

    PENDING, VALIDATING, READY, REJECTED = Status  # short names: AdapterVersion.READY

    adapter = models.ForeignKey(Adapter, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    uid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    source = models.CharField(max_length=1100, help_text="'upload' or the s3:// prefix imported")

    config_key = models.CharField(max_length=500)
    weights_key = models.CharField(max_length=500)
    config_sha256 = models.CharField(max_length=64)
    weights_sha256 = models.CharField(max_length=64)
    config_size = models.PositiveBigIntegerField()
    weights_size = models.PositiveBigIntegerField()

    rank = models.PositiveIntegerField(null=True, blank=True)
    alpha = models.FloatField(null=True, blank=True)
    target_modules = models.JSONField(default=list, blank=True)
    spec = models.JSONField(null=True, blank=True, help_text="what the engine needs, once ready")
    report = models.JSONField(
        default=list, blank=True, help_text="[{name, passed, level, message}]"
    )
    status_detail = models.TextField(blank=True)
    infra_failure = models.BooleanField(
        default=False, help_text="rejected because storage or a worker failed, not for its content"
    )

    # Compatibility with the base model's revision: re-checked whenever a new one is imported.
    checked_revision = models.CharField(max_length=64, blank=True)
    compatible = models.BooleanField(null=True, blank=True)
    compatibility_detail = models.TextField(blank=True)

    attempts = models.PositiveIntegerField(default=0, help_text="validation runs started")
    validation_started_at = models.DateTimeField(null=True, blank=True)
    validated_at = models.DateTimeField(null=True, blank=True)
    created_by = models.CharField(max_length=100)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["adapter_id", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["adapter", "number"], name="version_number_unique"),
        ]
        indexes = [
            models.Index(fields=["status", "validation_started_at"]),
            models.Index(fields=["adapter", "config_sha256", "weights_sha256"]),
        ]

    def __str__(self):
        return f"{self.adapter}/v{self.number}"

    @property
    def size(self) -> int:
        return self.config_size + self.weights_size

    @property
    def label(self) -> str:
        return f"{self.adapter.name}/v{self.number}"

    def servable_on(self, base_model: BaseModel) -> bool:
        """Ready, and checked compatible with exactly the base model's current revision."""
        return (
            self.status == self.READY
            and self.compatible is True
            and self.checked_revision == base_model.revision
        )


class Alias(models.Model):
    """A movable name for one version of an adapter: moving it is rollout and rollback."""

    adapter = models.ForeignKey(Adapter, on_delete=models.CASCADE, related_name="aliases")
    name = models.CharField(max_length=63, validators=[alias_name_validator])
    version = models.ForeignKey(AdapterVersion, on_delete=models.PROTECT, related_name="aliases")
    weight = models.PositiveSmallIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0), MaxValueValidator(100)],
        help_text="canary only: percent of requests for the bare adapter name sent here",
    )
    updated_by = models.CharField(max_length=100)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["adapter_id", "name"]
        verbose_name_plural = "aliases"
        constraints = [
            models.UniqueConstraint(fields=["adapter", "name"], name="alias_name_unique"),
        ]

    def __str__(self):
        return f"{self.adapter}@{self.name} -> v{self.version.number}"
