"""Turning an `Authorization` header into an ApiKey, or a precise reason why not.

Plain Python (no DRF) so the async OpenAI-compatible views and the REST API share it. Every
reason a caller is not let in is a `KeyRejected`, one class per code: 401 when the
credentials themselves are missing or wrong, 403 when they are fine but do not reach far
enough (a suspended tenant, no membership, a missing scope).
"""

from platform_site.errors import ApiError

from .key_cache import KEYS
from .keys import hash_key, key_matches, split_key
from .models import ApiKey

BEARER_CHALLENGE = 'Bearer realm="loraplex"'
NO_CREDENTIALS = "No credentials: send 'Authorization: Bearer <api key>'."


class KeyRejected(ApiError, status=401):
    """The caller's credentials do not let it in; a 401 names the scheme that would work."""

    def __init__(self, message: str | None = None, **kwargs):
        super().__init__(message, **kwargs)
        if self.status == 401:
            self.headers.setdefault("WWW-Authenticate", BEARER_CHALLENGE)


class MissingApiKey(KeyRejected, status=401, code="missing_api_key"):
    """No credentials at all (also DRF's NotAuthenticated)."""


class MalformedAuthorization(KeyRejected, status=401, code="malformed_authorization"):
    """An `Authorization` header that is not `Bearer <token>`."""


class InvalidApiKey(KeyRejected, status=401, code="invalid_api_key"):
    """No such key, or the secret does not match."""


class RevokedApiKey(KeyRejected, status=401, code="revoked_api_key"):
    """A key that was revoked."""


class ExpiredApiKey(KeyRejected, status=401, code="expired_api_key"):
    """A key past its expiry date."""


class TenantSuspended(KeyRejected, status=403, code="tenant_suspended"):
    """The operator suspended the tenant: its keys and its members are refused."""


class NoTenant(KeyRejected, status=403, code="no_tenant"):
    """A signed-in user who is not a member of the chosen tenant."""


class InsufficientScope(KeyRejected, status=403, code="insufficient_scope"):
    """The key's scopes (or the member's role) do not include what this endpoint needs."""


def bearer_token(header: str | None) -> str:
    if not header:
        raise MissingApiKey(NO_CREDENTIALS)
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise MalformedAuthorization("The Authorization header must be 'Bearer <api key>'.")
    return token.strip()


def api_key_from_header(header: str | None) -> ApiKey:
    """Reads the database unless the key was verified in this process within the last
    second (tenants/key_cache.py)."""
    raw = bearer_token(header)
    api_key = cached_api_key(raw)
    if api_key is None:
        parts = split_key(raw)
        if parts is None:
            raise InvalidApiKey("Malformed API key: expected 'lpx_<prefix>_<secret>'.")
        api_key = ApiKey.objects.select_related("tenant").filter(prefix=parts[0]).first()
        if api_key is None or not key_matches(raw, api_key.hashed_key):
            raise InvalidApiKey("Incorrect API key.")
        KEYS.put(api_key.hashed_key, api_key)
    require_usable(api_key)
    return api_key


def cached_api_key(raw: str) -> ApiKey | None:
    """The key behind `raw` if this process verified it within the last second; no query."""
    return KEYS.get(hash_key(raw))


def require_usable(api_key: ApiKey) -> None:
    if api_key.is_revoked:
        raise RevokedApiKey("This API key has been revoked.")
    if api_key.is_expired:
        raise ExpiredApiKey("This API key has expired.")
    require_active(api_key.tenant)


def require_active(tenant) -> None:
    """A suspended tenant is refused, whether its key or its member calls."""
    if not tenant.is_active:
        raise TenantSuspended("This tenant is suspended; contact the operator.")
