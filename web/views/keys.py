"""API keys: create (the full key appears once, in the answer to the POST), list, revoke."""

from datetime import timedelta

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.shortcuts import redirect
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from tenants.errors import ScopeNotHeld
from tenants.scopes import KEYS_WRITE
from tenants.selectors import api_key_get, api_key_list
from tenants.services import api_key_create, api_key_revoke

from ..decorators import member_required, scope_required
from ..forms import ApiKeyCreateForm
from ..pages import render_page


def _page(request, form, *, new_key=None, status=200):
    context = {"form": form, "new_key": new_key, "keys": []}
    if request.principal.has_scope(KEYS_WRITE):
        context["keys"] = api_key_list(tenant=request.principal.tenant)
    response = render_page(request, "web/keys/list.html", context, status=status)
    if new_key is not None:
        response["Cache-Control"] = "no-store"  # the only copy of the key: keep it out of caches
    return response


@require_http_methods(["GET", "POST"])
def keys(request):
    """GET shows the page; POST creates a key (admins and owners)."""
    return key_create(request) if request.method == "POST" else key_list(request)


@member_required
def key_list(request):
    """Members see the page (and why they cannot manage keys), not the keys."""
    return _page(request, ApiKeyCreateForm())


@scope_required(KEYS_WRITE)
def key_create(request):
    form = ApiKeyCreateForm(request.POST)
    if not form.is_valid():
        return _page(request, form, status=400)
    days = form.cleaned_data["expires_in_days"]
    try:
        api_key, full = api_key_create(
            tenant=request.principal.tenant,
            name=form.cleaned_data["name"],
            scopes=form.cleaned_data["scopes"],
            created_by=request.user,
            expires_at=timezone.now() + timedelta(days=days) if days else None,
            actor=request.principal.label,
            grantable=request.principal.scopes,
        )
    except ValidationError as exc:
        for field, errors in exc.message_dict.items():
            form.add_error(field if field in form.fields else None, errors)
        return _page(request, form, status=400)
    except ScopeNotHeld as exc:
        form.add_error("scopes", exc.message)
        return _page(request, form, status=exc.status)
    return _page(request, ApiKeyCreateForm(), new_key={"key": api_key, "full": full}, status=201)


@require_POST
@scope_required(KEYS_WRITE)
def key_revoke(request, key_id):
    api_key = api_key_get(tenant=request.principal.tenant, key_id=key_id)
    api_key_revoke(api_key=api_key, actor=request.principal.label)
    messages.success(request, f"Revoked key '{api_key.name}' (lpx_{api_key.prefix}_…).")
    return redirect("web:keys")
