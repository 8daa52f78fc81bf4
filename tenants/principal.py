"""Who is calling, for which tenant, allowed to do what: one answer for keys and signed-in users.

An API key acts for its own tenant with its scopes. A signed-in user acts for the tenant
chosen with the `X-Loraplex-Tenant` header or the session (else their first), with the
scopes their role implies.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .keyauth import NoTenant, require_active
from .models import ApiKey, Tenant
from .scopes import SCOPES_BY_ROLE
from .selectors import membership_for

if TYPE_CHECKING:
    from django.contrib.auth.base_user import AbstractBaseUser

TENANT_HEADER = "HTTP_X_LORAPLEX_TENANT"
SESSION_TENANT = "tenant_slug"


@dataclass(frozen=True)
class Principal:
    tenant: Tenant
    scopes: frozenset
    user: "AbstractBaseUser | None" = None
    api_key: ApiKey | None = None
    role: str | None = None

    def has_scope(self, scope: str) -> bool:
        return scope in self.scopes

    @property
    def label(self) -> str:
        """How audit trails and errors name the caller."""
        if self.api_key is not None:
            return f"key:{self.api_key.prefix}"
        assert self.user is not None, "a principal is an API key or a signed-in user"
        return f"user:{self.user.get_username()}"

    def missing_scope_message(self, scope: str) -> str:
        if self.api_key is not None:
            return f"This API key lacks the '{scope}' scope."
        return f"Your role '{self.role}' in tenant '{self.tenant.slug}' does not allow '{scope}'."


class KeyUser:
    """request.user for key-authenticated requests: authenticated, but not a person."""

    is_authenticated = True
    is_anonymous = False
    is_staff = False
    is_superuser = False

    def __init__(self, api_key: ApiKey):
        self.api_key = api_key

    def __str__(self):
        return f"api key {self.api_key.prefix}"


def principal_for(
    *, user=None, api_key: ApiKey | None = None, tenant_slug: str | None = None
) -> Principal:
    if api_key is not None:
        return Principal(tenant=api_key.tenant, scopes=frozenset(api_key.scopes), api_key=api_key)
    membership = membership_for(user=user, tenant_slug=tenant_slug)
    if membership is None:
        raise NoTenant("You are not a member of this tenant.")
    require_active(membership.tenant)
    return Principal(
        tenant=membership.tenant,
        scopes=SCOPES_BY_ROLE[membership.role],
        user=user,
        role=membership.role,
    )


def principal_for_request(request) -> Principal:
    cached = getattr(request, "_loraplex_principal", None)
    if cached is not None:
        return cached
    api_key = request.auth if isinstance(getattr(request, "auth", None), ApiKey) else None
    slug = request.META.get(TENANT_HEADER) or (
        request.session.get(SESSION_TENANT) if hasattr(request, "session") else None
    )
    principal = principal_for(user=request.user, api_key=api_key, tenant_slug=slug)
    request._loraplex_principal = principal
    return principal
