"""Who may call the operator endpoints: the operator token, or a staff session with the
`registry.operate_engines` permission."""

import hmac

from django.conf import settings

from inference.auth import require_csrf
from inference.errors import OperatorOnly
from registry.permissions import OPERATE_ENGINES, can_operate_engines
from tenants.keyauth import bearer_token

TOKEN_ACTOR = "operator"  # who the audit trail says registered a version with the token


def authorize(request) -> str:
    """Who is operating, for the audit trail. A session (no Authorization header) needs the
    permission and, to change anything, the page's CSRF token: a staff member's browser must
    not be driven by another site."""
    header = request.META.get("HTTP_AUTHORIZATION")
    user = getattr(request, "user", None)
    if not header and user is not None and user.is_authenticated:
        if not can_operate_engines(user):
            raise OperatorOnly(f"Operator endpoints need the {OPERATE_ENGINES} permission.")
        require_csrf(request)
        return f"admin:{user.get_username()}"
    given = bearer_token(header)
    token = settings.OPERATOR_TOKEN
    if not token or not hmac.compare_digest(given.encode(), token.encode()):
        raise OperatorOnly(
            "Operator endpoints need the operator token, or a staff session with the "
            f"{OPERATE_ENGINES} permission."
        )
    return TOKEN_ACTOR
