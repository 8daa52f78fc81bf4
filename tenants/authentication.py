"""DRF glue: API keys in; refusals are KeyRejected errors, answered by the one error handler."""

from rest_framework import authentication, permissions
from rest_framework import exceptions as drf

from platform_site.error_translations import Translation

from .keyauth import (
    BEARER_CHALLENGE,
    NO_CREDENTIALS,
    InsufficientScope,
    InvalidApiKey,
    KeyRejected,
    MissingApiKey,
    api_key_from_header,
)
from .principal import KeyUser, principal_for_request
from .services import api_key_touch

# DRF's authentication failures answer in this app's codes (registered by TenantsConfig);
# its NotAuthenticated's own text does not say what to send.
TRANSLATIONS = {
    drf.NotAuthenticated: Translation(MissingApiKey, words=NO_CREDENTIALS),
    drf.AuthenticationFailed: Translation(InvalidApiKey),
}


class ApiKeyAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer lpx_...`. No header means "try the next authenticator" (session)."""

    def authenticate(self, request):
        header = request.META.get("HTTP_AUTHORIZATION")
        if not header:
            return None
        try:
            api_key = api_key_from_header(header)
        except KeyRejected:
            # What DRF does for its own exceptions, so that rendering the refusal (the
            # browsable API reads request.user) does not authenticate, and fail, again.
            request._not_authenticated()
            raise
        api_key_touch(api_key=api_key)
        return KeyUser(api_key), api_key

    def authenticate_header(self, request):
        return BEARER_CHALLENGE  # also keeps DRF from turning NotAuthenticated into a 403


class TenantScope(permissions.BasePermission):
    """The view names the scope each method needs in `required_scopes`; '*' is the default."""

    def has_permission(self, request, view):
        if not (request.user and request.user.is_authenticated):
            return False
        principal = principal_for_request(request)
        required = view.required_scopes.get(request.method, view.required_scopes.get("*"))
        if required and not principal.has_scope(required):
            raise InsufficientScope(principal.missing_scope_message(required))
        return True
