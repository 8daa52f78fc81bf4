"""Errors a caller can act on, raised by services; the API turns each into its status and code."""


class RegistryError(Exception):
    status_code = 400
    code = "invalid_request"

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code


class Conflict(RegistryError):
    """The request is fine but the registry's state forbids it (409)."""

    status_code = 409
    code = "conflict"


class UploadTooLarge(RegistryError):
    status_code = 413
    code = "upload_too_large"


class StorageUnavailable(RegistryError):
    """Object storage could not be reached or failed; worth retrying later (503)."""

    status_code = 503
    code = "storage_unavailable"


class ObjectMissing(RegistryError):
    """An object the registry recorded is not in storage: retrying will not bring it back."""

    status_code = 500
    code = "object_missing"


class NotServable(Conflict):
    """The version exists but may not be served (not ready, or not checked against this base)."""

    code = "version_not_servable"
