"""Errors a caller can act on, raised by the registry's services: one class per code.

They are ApiErrors, so the API answers each with its status and code without translating;
the web pages show their `message`. Grouped by what the caller got wrong.
"""

from platform_site.errors import ApiError


class RegistryError(ApiError):
    """Base of the registry's refusals (400 unless a subclass says otherwise)."""


# ---------------------------------------------------------------- names and base models


class InvalidName(RegistryError, code="invalid_name"):
    """An adapter name outside the slug rule (registry/names.py)."""


class NameTaken(RegistryError, code="name_taken"):
    """An adapter may not shadow a base model's name in model strings."""


class NoBaseModel(RegistryError, code="no_base_model"):
    """No base model is served yet, so an adapter has nothing to attach to."""


class UnknownBaseModel(RegistryError, code="unknown_base_model"):
    """The named base model is not imported."""


# ---------------------------------------------------------------- aliases


class InvalidAlias(RegistryError, code="invalid_alias"):
    """An alias name outside the slug rule."""


class ReservedAlias(RegistryError, code="reserved_alias"):
    """`latest` and `v<N>` always mean what they say; they cannot be set."""


class UnknownVersion(RegistryError, code="unknown_version"):
    """The alias would point at a version number the adapter does not have."""


class WeightNotAllowed(RegistryError, code="weight_not_allowed"):
    """Only the canary alias takes a traffic weight."""


class InvalidWeight(RegistryError, code="invalid_weight"):
    """A canary weight outside 0..100."""


# ---------------------------------------------------------------- uploads and imports


class UnexpectedFile(RegistryError, code="unexpected_file"):
    """A multipart upload with a file field other than `config` and `weights`."""


class InvalidSource(RegistryError, code="invalid_source"):
    """An import source that is not `s3://bucket/prefix/`."""


class SourceNotAllowed(RegistryError, code="source_not_allowed"):
    """An import from outside the tenant's allowed prefixes (or the operator's buckets)."""


class SourceNotFound(RegistryError, code="source_not_found"):
    """One of the two PEFT files is missing under the source, or may not be read: one answer
    for both, so that imports cannot probe which objects exist."""


class UploadTooLarge(RegistryError, status=413, code="upload_too_large"):
    """More bytes than this deployment accepts for an adapter (or an eval set)."""


class InsufficientStorage(RegistryError, status=507, code="insufficient_storage"):
    """This server's disk filled up while receiving the files; nothing was kept."""


class InvalidEvalSet(RegistryError, code="invalid_eval_set"):
    """An eval set that is not JSONL rows of `completion` plus `messages` or `prompt` within the
    limits; the message starts with the line and names the field (also `line` and `field`)."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        line: int | None = None,
        field: str | None = None,
    ):
        super().__init__(message, param=param)
        self.line = line
        self.field = field


# ---------------------------------------------------------------- quotas (per tenant)


class QuotaExceeded(RegistryError):
    """Base of the per-tenant quotas: each code names its quota; nothing was stored."""


class PendingVersionsQuotaExceeded(QuotaExceeded, status=429, code="quota_pending_versions"):
    """Too many of the tenant's versions await validation; Retry-After says when to try."""


class UploadsPerHourQuotaExceeded(QuotaExceeded, status=429, code="quota_uploads_per_hour"):
    """The tenant made its uploads and imports for this hour; Retry-After says when to try."""


class AdapterBytesQuotaExceeded(QuotaExceeded, status=403, code="quota_adapter_bytes"):
    """The tenant's stored adapter versions would pass its storage quota."""


# ---------------------------------------------------------------- state conflicts (409)


class Conflict(RegistryError, status=409, code="conflict"):
    """The request is fine but the registry's state forbids it."""


class AdapterExists(Conflict, code="adapter_exists"):
    """The tenant already has an adapter of that name."""


class AdapterInUse(Conflict, code="adapter_in_use"):
    """Aliases still point at the adapter's versions."""


class VersionNotReady(Conflict, code="version_not_ready"):
    """An alias may only point at a ready version."""


class VersionIncompatible(Conflict, code="version_incompatible"):
    """The version has not been checked against (or failed on) the adapter's base model."""


class EvaluationNotPassed(Conflict, code="evaluation_not_passed"):
    """An alias may only point at a version whose evaluation passed on the base model's
    current revision (or that an operator overrode); the message says which figure failed."""


class CanaryIsProduction(Conflict, code="canary_is_production"):
    """A canary tries a version beside production's: pointing it at production's own version
    would split traffic between a version and itself."""


class InvalidTransition(Conflict, code="invalid_transition"):
    """A version's status may not move that way (a ready version is immutable)."""


class NotServable(Conflict, code="version_not_servable"):
    """The version exists but may not be served (not ready, not checked against this base, or
    not passed its evaluation there)."""


# ---------------------------------------------------------------- storage (the operator's side)


class StorageUnavailable(RegistryError, status=503, code="storage_unavailable"):
    """Object storage could not be reached or failed; worth retrying later."""


class ObjectMissing(RegistryError, status=500, code="object_missing"):
    """An object the registry recorded is not in storage: retrying will not bring it back."""
