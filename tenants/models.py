from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from platform_site.s3_locations import S3Location, parse_s3_locations

from .scopes import MEMBER, ROLE_CHOICES


def validate_import_prefixes(value: str) -> None:
    try:
        parse_s3_locations(value)
    except ValueError as exc:
        raise ValidationError(str(exc)) from None


class Tenant(models.Model):
    """A customer. Everything a tenant owns hangs off this row; suspending it stops all use."""

    slug = models.SlugField(max_length=63, unique=True)
    name = models.CharField(max_length=200)
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    # Set by an operator in the admin. Quotas left empty take the deployment's default
    # (LORAPLEX_QUOTA_*); 0 means no limit.
    s3_import_prefixes = models.TextField(
        blank=True,
        max_length=10_000,
        validators=[validate_import_prefixes],
        help_text=(
            "One s3://bucket/prefix/ per line: the only places this tenant may import adapters "
            "from (a source must lie under one of them, whole path segments; its bucket must "
            "also be in LORAPLEX_S3_IMPORT_BUCKETS). Empty: no imports."
        ),
    )
    max_pending_versions = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Versions awaiting validation at once. Empty: LORAPLEX_QUOTA_PENDING_VERSIONS.",
    )
    max_uploads_per_hour = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Uploads and imports in any hour. Empty: LORAPLEX_QUOTA_UPLOADS_PER_HOUR.",
    )
    max_adapter_bytes = models.PositiveBigIntegerField(
        null=True,
        blank=True,
        help_text="Bytes of stored adapter versions. Empty: LORAPLEX_QUOTA_ADAPTER_BYTES.",
    )

    class Meta:
        ordering = ["slug"]

    def __str__(self):
        return self.slug

    @property
    def import_prefixes(self) -> list[S3Location]:
        """The parsed `s3_import_prefixes` (validated when saved through a form)."""
        try:
            return parse_s3_locations(self.s3_import_prefixes)
        except ValueError:
            return []  # a row written around validation allows nothing


class Membership(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=ROLE_CHOICES, default=MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["user", "tenant"], name="one_membership_per_user_and_tenant"
            )
        ]
        ordering = ["tenant__slug", "user__username"]

    def __str__(self):
        return f"{self.user} in {self.tenant} ({self.role})"


class ApiKey(models.Model):
    """An API key. Only the HMAC of the full key is stored; `prefix` finds the row."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=12, unique=True)
    hashed_key = models.CharField(max_length=64)
    scopes = models.JSONField(default=list)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return f"{self.name} (lpx_{self.prefix}_…)"

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None

    @property
    def is_expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= timezone.now()

    def has_scope(self, scope: str) -> bool:
        return scope in self.scopes


class UsageRecord(models.Model):
    """One inference request, metered: written off the request path, in batches."""

    class Status(models.TextChoices):
        OK = "ok", "OK"
        ERROR = "error", "Error"
        ABORTED = "aborted", "Aborted"

    OK, ERROR, ABORTED = Status  # short names: UsageRecord.OK

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="usage")
    api_key = models.ForeignKey(
        ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    adapter_version = models.ForeignKey(
        "registry.AdapterVersion",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    model = models.CharField(max_length=200, help_text="The model name as the client sent it.")
    endpoint = models.CharField(max_length=32)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    ttft_ms = models.PositiveIntegerField(null=True, blank=True)
    duration_ms = models.PositiveIntegerField(default=0)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.OK)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["tenant", "created_at"], name="usage_tenant_time")]

    def __str__(self):
        return f"{self.tenant} {self.model} {self.prompt_tokens}+{self.completion_tokens}"
