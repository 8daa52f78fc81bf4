"""Base models, tenants' adapters, their immutable versions and aliases (rollouts).

Rows are changed only through `registry.services`; reads go through `registry.selectors`,
which is where tenant isolation lives.
"""

from __future__ import annotations

import math
import uuid

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from tenants.models import Tenant

from .names import adapter_name_validator, alias_name_validator, base_model_name_validator


class BaseModel(models.Model):
    """A base model this deployment knows. Each engine replica serves one (LORAPLEX_BASE_MODEL),
    and any number are served side by side by their own replicas; the default one (at most
    one) gets the adapters created without naming a base, and runs where no name is set."""

    name = models.CharField(max_length=100, unique=True, validators=[base_model_name_validator])
    revision = models.CharField(
        max_length=64, help_text="sha256 over config.json and every weight's name, shape and bytes"
    )
    fingerprint = models.JSONField(help_text="ArchFingerprint.to_dict(): the shapes adapters fit")
    quantization = models.CharField(
        max_length=64,
        blank=True,
        default="",
        help_text="the revision's quantization scheme (fp8-dynamic, w4a16-g128, ...); "
        "blank: weights in a float dtype",
    )
    local_path = models.CharField(max_length=1000)
    is_default = models.BooleanField(
        default=False, help_text="adapters created without naming a base model go on this one"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(
                fields=["is_default"], condition=Q(is_default=True), name="one_default_base_model"
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

    class Quality(models.TextChoices):
        """The quality gate's verdict on the base revision in `quality_revision`
        (registry/services/quality.py moves it; registry/quality.py is the gate)."""

        UNEVALUATED = "unevaluated", "unevaluated"
        PENDING = "pending", "pending"  # an evaluation is due (new version, new base revision)
        PASSED = "passed", "passed"
        DEGRADED = "degraded", "degraded"  # a figure passed its factor
        FAILED = "failed", "failed"  # could not be evaluated (engine, eval set, no reference)
        OVERRIDDEN = "overridden", "overridden"  # an operator lets a degraded or failed one serve

    SERVABLE_QUALITY = (Quality.PASSED, Quality.OVERRIDDEN)

    adapter = models.ForeignKey(Adapter, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    uid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    # Where the files came from, as the tenant may see it; an operator's host path or bucket
    # is the deployment's, not the tenant's to read, so it stays in `operator_source`.
    FROM_UPLOAD = "upload"
    FROM_OPERATOR = "operator"
    source = models.CharField(
        max_length=1100,
        help_text="'upload', the s3:// prefix the tenant imported, or 'operator' (the files an "
        "operator registered: operator_source says from where)",
    )
    operator_source = models.CharField(
        max_length=1100,
        blank=True,
        default="",
        help_text="the folder or s3:// prefix an operator registered the files from; for "
        "operators only, never shown to the tenant",
    )

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

    # The quality gate (registry/quality.py): servable only once passed on the current revision.
    quality = models.CharField(max_length=16, choices=Quality.choices, default=Quality.UNEVALUATED)
    quality_revision = models.CharField(
        max_length=64, blank=True, help_text="the base model revision the quality verdict is for"
    )
    quality_detail = models.TextField(blank=True, help_text="why: the figures, or what failed")
    reference_evaluation = models.ForeignKey(
        "Evaluation",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        help_text="its first evaluation with figures: the perplexity later ones are held to",
    )
    accepted_revision = models.CharField(
        max_length=64,
        blank=True,
        help_text="the base revision of its first verdict: only there may a reference be measured",
    )
    quality_overridden_by = models.CharField(max_length=100, blank=True)
    quality_overridden_at = models.DateTimeField(null=True, blank=True)

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
            models.Index(fields=["quality", "quality_revision"]),
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
        """Ready, checked compatible with exactly the base model's current revision, and its
        evaluation on that revision passed (or an operator overrode its verdict there)."""
        return (
            self.status == self.READY
            and self.compatible is True
            and self.checked_revision == base_model.revision
            and self.quality in self.SERVABLE_QUALITY
            and self.quality_revision == base_model.revision
        )

    @property
    def reference_perplexity(self) -> float | None:
        """The adapter's perplexity at its first evaluation: what the gate compares with."""
        reference = self.reference_evaluation
        return None if reference is None else reference.adapter_perplexity

    @property
    def latest_evaluation(self) -> Evaluation | None:
        """The newest evaluation (reads `evaluations` as prefetched, when it is)."""
        return max(self.evaluations.all(), key=lambda e: e.pk, default=None)


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


class EvalSet(models.Model):
    """JSONL rows an adapter's versions are measured on (registry/eval_sets.py says what a
    valid one is). It belongs to an adapter (the tenant's own) or to a base model (the
    operator's generic set, for adapters without their own).

    Rows are immutable, like versions: replacing a set adds a row and marks it current, so
    a figure computed on a set can point at exactly the bytes it used. Superseded rows that
    nothing points at are deleted with their object (registry/services/eval_sets.py); the
    tenant's audit trail keeps the history.
    """

    adapter = models.ForeignKey(
        Adapter, on_delete=models.CASCADE, null=True, blank=True, related_name="eval_sets"
    )
    base_model = models.ForeignKey(
        BaseModel, on_delete=models.CASCADE, null=True, blank=True, related_name="eval_sets"
    )
    is_current = models.BooleanField(default=True)
    uid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    key = models.CharField(max_length=500, help_text="object storage key of the JSONL bytes")
    sha256 = models.CharField(max_length=64)
    size = models.PositiveBigIntegerField(help_text="bytes")
    rows = models.PositiveIntegerField()
    created_by = models.CharField(max_length=100)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(adapter__isnull=False, base_model__isnull=True)
                | Q(adapter__isnull=True, base_model__isnull=False),
                name="eval_set_one_owner",
            ),
            models.UniqueConstraint(
                fields=["adapter"], condition=Q(is_current=True), name="one_current_eval_set"
            ),
            models.UniqueConstraint(
                fields=["base_model"],
                condition=Q(is_current=True),
                name="one_current_generic_eval_set",
            ),
        ]

    def __str__(self):
        owner = self.adapter if self.adapter_id is not None else self.base_model
        return f"eval set of {owner} ({self.rows} rows, {self.sha256[:12]})"

    @property
    def is_generic(self) -> bool:
        """The operator's set for a base model, not an adapter's own."""
        return self.adapter_id is None

    @property
    def kind(self) -> str:
        return "generic" if self.is_generic else "own"


class Evaluation(models.Model):
    """One measurement of a version on an eval set, on one revision of its base model: the
    completions' mean negative log-likelihood and perplexity under the adapter and under the
    base model alone (scored by the engine), and the gate's verdict.

    Its eval set is kept while it exists (RESTRICT: a superseded set stays with its bytes,
    and goes with its adapter), so later evaluations of the version re-measure exactly the
    rows its reference figure came from.
    """

    class Status(models.TextChoices):
        QUEUED = "queued", "queued"
        RUNNING = "running", "running"
        PASSED = "passed", "passed"
        DEGRADED = "degraded", "degraded"
        FAILED = "failed", "failed"

    class Trigger(models.TextChoices):
        UPLOAD = "upload", "upload"  # validation found the version ready
        BASE_UPGRADE = "base_upgrade", "base upgrade"  # a new base revision, re-checked
        EVAL_SET = "eval_set", "eval set attached"  # measuring a version accepted unmeasured
        RERUN = "rerun", "re-run by an operator"

    FINISHED = (Status.PASSED, Status.DEGRADED, Status.FAILED)

    version = models.ForeignKey(
        AdapterVersion, on_delete=models.CASCADE, related_name="evaluations"
    )
    eval_set = models.ForeignKey(
        EvalSet,
        on_delete=models.RESTRICT,
        null=True,
        blank=True,
        related_name="evaluations",
        help_text="none: there was no eval set to measure on",
    )
    eval_set_sha256 = models.CharField(max_length=64, blank=True)
    base_revision = models.CharField(max_length=64)
    base_quantization = models.CharField(
        max_length=64, blank=True, default="", help_text="that revision's quantization scheme"
    )
    trigger = models.CharField(max_length=16, choices=Trigger.choices)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)

    adapter_tokens = models.PositiveIntegerField(null=True, blank=True)
    adapter_nll = models.FloatField(null=True, blank=True, help_text="mean per token")
    adapter_perplexity = models.FloatField(null=True, blank=True)
    base_tokens = models.PositiveIntegerField(null=True, blank=True)
    base_nll = models.FloatField(null=True, blank=True, help_text="mean per token")
    base_perplexity = models.FloatField(null=True, blank=True)
    rows = models.JSONField(
        default=list, blank=True, help_text="per row: {tokens, adapter_nll, base_nll} (sums)"
    )
    reference_perplexity = models.FloatField(
        null=True, blank=True, help_text="the version's first figure, this one was held to"
    )
    reason = models.TextField(blank=True, help_text="the verdict: which figure, by how much")

    attempts = models.PositiveIntegerField(default=0, help_text="runs started")
    requested_by = models.CharField(max_length=100)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    duration_seconds = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["status", "created_at"])]

    def __str__(self):
        return f"{self.version} on {self.base_revision[:12]}: {self.status}"

    @property
    def ratio(self) -> float | None:
        """Adapter perplexity over the reference (its first evaluation's)."""
        return _ratio(self.adapter_perplexity, self.reference_perplexity)

    @property
    def base_ratio(self) -> float | None:
        """Adapter perplexity over the base model's alone, on the same rows."""
        return _ratio(self.adapter_perplexity, self.base_perplexity)


def _ratio(value: float | None, reference: float | None) -> float | None:
    if value is None or not reference or not math.isfinite(value / reference):
        return None
    return value / reference
