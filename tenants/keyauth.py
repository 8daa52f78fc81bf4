"""Turning an `Authorization` header into an ApiKey, or a precise reason why not.

Plain Python (no DRF) so the async OpenAI-compatible views and the REST API share it.
"""

from .keys import key_matches, split_key
from .models import ApiKey


class KeyRejected(Exception):
    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def bearer_token(header: str | None) -> str:
    if not header:
        raise KeyRejected(
            401, "missing_api_key", "No credentials: send 'Authorization: Bearer <api key>'."
        )
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise KeyRejected(
            401, "malformed_authorization", "The Authorization header must be 'Bearer <api key>'."
        )
    return token.strip()


def api_key_from_header(header: str | None) -> ApiKey:
    raw = bearer_token(header)
    parts = split_key(raw)
    if parts is None:
        raise KeyRejected(
            401, "invalid_api_key", "Malformed API key: expected 'lpx_<prefix>_<secret>'."
        )
    api_key = ApiKey.objects.select_related("tenant").filter(prefix=parts[0]).first()
    if api_key is None or not key_matches(raw, api_key.hashed_key):
        raise KeyRejected(401, "invalid_api_key", "Incorrect API key.")
    if api_key.is_revoked:
        raise KeyRejected(401, "revoked_api_key", "This API key has been revoked.")
    if api_key.is_expired:
        raise KeyRejected(401, "expired_api_key", "This API key has expired.")
    if not api_key.tenant.is_active:
        raise KeyRejected(
            403, "tenant_suspended", "This tenant is suspended; contact the operator."
        )
    return api_key
