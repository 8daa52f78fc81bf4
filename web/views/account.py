"""Signing in (Django's views), the landing page, and switching between one's tenants."""

from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from tenants.principal import SESSION_TENANT
from tenants.selectors import memberships_for_user


@login_required
def home(request):
    return redirect("web:adapters")


@login_required
@require_POST
def tenant_switch(request):
    """Only to a tenant the user belongs to; any other slug is a 404, like a missing one."""
    slug = request.POST.get("tenant", "")
    if not memberships_for_user(request.user).filter(tenant__slug=slug).exists():
        raise Http404("No such tenant.")
    request.session[SESSION_TENANT] = slug
    # Object pages name the old tenant's objects; start the new tenant from its adapters.
    return redirect("web:adapters")
