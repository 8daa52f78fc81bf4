"""DRF glue: API keys in, the same error codes as every other path out."""

from rest_framework import authentication, exceptions, permissions

from .keyauth import KeyRejected, api_key_from_header
from .principal import KeyUser, principal_for_request
from .services import api_key_touch


def as_drf_error(rejected: KeyRejected) -> exceptions.APIException:
    cls = exceptions.AuthenticationFailed if rejected.status == 401 else exceptions.PermissionDenied
    return cls(detail=rejected.message, code=rejected.code)


class ApiKeyAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer lpx_...`. No header means "try the next authenticator" (session)."""

    def authenticate(self, request):
        header = request.META.get("HTTP_AUTHORIZATION")
        if not header:
            return None
        try:
            api_key = api_key_from_header(header)
        except KeyRejected as rejected:
            raise as_drf_error(rejected) from None
        api_key_touch(api_key=api_key)
        return KeyUser(api_key), api_key

    def authenticate_header(self, request):
        return 'Bearer realm="loraplex"'


class TenantScope(permissions.BasePermission):
    """The view names the scope each method needs in `required_scopes`; '*' is the default."""

    def has_permission(self, request, view):
        if not (request.user and request.user.is_authenticated):
            return False
        try:
            principal = principal_for_request(request)
        except KeyRejected as rejected:
            raise as_drf_error(rejected) from None
        required = view.required_scopes.get(request.method, view.required_scopes.get("*"))
        if required and not principal.has_scope(required):
            raise exceptions.PermissionDenied(
                detail=principal.missing_scope_message(required), code="insufficient_scope"
            )
        return True
