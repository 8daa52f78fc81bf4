"""Refusals of the tenants' services; refusals of credentials live in keyauth.py."""

from platform_site.errors import ApiError


class ScopeNotHeld(ApiError, status=403, code="scope_not_held"):
    """A new key may carry only scopes its creator holds: no key can mint a stronger one."""

    param = "scopes"
