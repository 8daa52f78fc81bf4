"""Rendering a page with what every page shows: the tenant, the tenant switcher, the role."""

from django.shortcuts import render

from tenants.scopes import INFERENCE, KEYS_WRITE, REGISTRY_WRITE
from tenants.selectors import memberships_for_user


def render_page(request, template: str, context: dict | None = None, *, status: int = 200):
    principal = getattr(request, "principal", None)
    memberships = (
        memberships_for_user(request.user).order_by("tenant__slug")
        if request.user.is_authenticated
        else []
    )
    base = {
        "principal": principal,
        "tenant": principal.tenant if principal else None,
        "memberships": memberships,
        "can_write": bool(principal and principal.has_scope(REGISTRY_WRITE)),
        "can_manage_keys": bool(principal and principal.has_scope(KEYS_WRITE)),
        "can_infer": bool(principal and principal.has_scope(INFERENCE)),
    }
    return render(request, template, base | (context or {}), status=status)


def is_htmx(request) -> bool:
    return request.headers.get("HX-Request") == "true"
