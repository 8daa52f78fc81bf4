"""Who may see a page: signed in, a member of the session's tenant, and holding a scope.

The tenant a page shows is `request.session["tenant_slug"]` (the same key the REST API and
the inference views read), so an upload or a playground request made from a page always
acts for the tenant that page shows.
"""

from functools import wraps

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.shortcuts import redirect

from tenants.keyauth import KeyRejected, NoTenant
from tenants.principal import SESSION_TENANT, principal_for

from .pages import render_page


def member_required(view):
    """Sets `request.principal` for the session's tenant (else the user's first one)."""

    @login_required
    @wraps(view)
    def wrapper(request, *args, **kwargs):
        slug = request.session.get(SESSION_TENANT)
        try:
            principal = principal_for(user=request.user, tenant_slug=slug)
        except KeyRejected as rejected:
            if isinstance(rejected, NoTenant) and slug:
                # Removed from that tenant since choosing it: fall back to their first one.
                del request.session[SESSION_TENANT]
                return redirect(request.get_full_path())
            request.principal = None
            return render_page(
                request, "web/no_tenant.html", {"reason": rejected.message}, status=403
            )
        if slug != principal.tenant.slug:
            request.session[SESSION_TENANT] = principal.tenant.slug
        request.principal = principal
        return view(request, *args, **kwargs)

    return wrapper


def scope_required(scope: str):
    """A member whose role lacks `scope` gets 403 (the page offers no such button either)."""

    def decorate(view):
        @member_required
        @wraps(view)
        def wrapper(request, *args, **kwargs):
            if not request.principal.has_scope(scope):
                raise PermissionDenied(request.principal.missing_scope_message(scope))
            return view(request, *args, **kwargs)

        return wrapper

    return decorate
