"""Adapter pages: the list, one adapter (versions, aliases, audit), the upload, live status.

The upload itself goes from the browser to the registry's REST endpoint (session + CSRF),
so there is one upload path; these views render and move aliases through the services.
"""

from django.conf import settings
from django.contrib import messages
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from registry import selectors
from registry.errors import RegistryError
from registry.services import adapters as adapter_services
from registry.services.aliases import alias_delete, alias_set
from registry.uploads import MAX_CONFIG_BYTES
from tenants.scopes import REGISTRY_READ, REGISTRY_WRITE

from ..decorators import scope_required
from ..forms import AdapterCreateForm, AliasSetForm
from ..pages import render_page
from ..selectors import (
    TERMINAL,
    adapter_audit_trail,
    adapter_rows,
    alias_move_refusals,
    evaluation_chart,
    rollback_targets,
)


def _list_page(request, form, status=200):
    tenant = request.principal.tenant
    context = {
        "rows": adapter_rows(tenant=tenant),
        "form": form,
        "base_model": selectors.base_model_default(),
    }
    return render_page(request, "web/adapters/list.html", context, status=status)


@require_http_methods(["GET", "POST"])
def adapters(request):
    """GET lists the adapters; POST creates one (admins and owners)."""
    return adapter_create(request) if request.method == "POST" else adapter_list(request)


@scope_required(REGISTRY_READ)
def adapter_list(request):
    return _list_page(request, AdapterCreateForm())


@scope_required(REGISTRY_WRITE)
def adapter_create(request):
    form = AdapterCreateForm(request.POST)
    if form.is_valid():
        try:
            adapter = adapter_services.adapter_create(
                tenant=request.principal.tenant,
                name=form.cleaned_data["name"],
                description=form.cleaned_data["description"],
                actor=request.principal.label,
            )
        except RegistryError as exc:
            form.add_error("name" if exc.param in (None, "name") else None, exc.message)
        else:
            messages.success(
                request, f"Created adapter '{adapter.name}'. Upload its first version."
            )
            return redirect("web:version-upload", name=adapter.name)
    return _list_page(request, form, status=400)


@require_GET
@scope_required(REGISTRY_READ)
def adapter_detail(request, name):
    tenant = request.principal.tenant
    adapter = selectors.adapter_get(tenant=tenant, name=name)
    versions = list(
        selectors.adapter_version_list(tenant=tenant, adapter_name=adapter.name).prefetch_related(
            "evaluations__eval_set", "reference_evaluation"
        )
    )
    for version in versions:
        version.evaluation, version.chart = evaluation_chart(version)
        version.alias_refusal, version.canary_refusal = alias_move_refusals(adapter, version)
    aliases = list(selectors.alias_list(tenant=tenant, adapter_name=adapter.name))
    targets = rollback_targets(tenant=tenant, adapter=adapter, aliases=aliases)
    for alias in aliases:
        alias.rollback_to = targets.get(alias.name)
    canary = next((a for a in aliases if a.name == "canary"), None)
    context = {
        "adapter": adapter,
        "versions": versions,
        "aliases": aliases,
        "production": next((a for a in aliases if a.name == "production"), None),
        "canary": canary,
        "production_share": 100 - ((canary.weight or 0) if canary else 0),
        "events": adapter_audit_trail(tenant=tenant, adapter=adapter),
        "ready_versions": [v for v in versions if v.status == "ready"],
        "eval_set": selectors.eval_set_for(adapter),
        "eval_set_api_url": reverse("registry-eval-set", kwargs={"name": adapter.name}),
        "eval_max_bytes": settings.EVAL_MAX_BYTES,
        "eval_max_rows": settings.EVAL_MAX_ROWS,
    }
    return render_page(request, "web/adapters/detail.html", context)


@require_GET
@scope_required(REGISTRY_WRITE)
def version_upload(request, name):
    adapter = selectors.adapter_get(tenant=request.principal.tenant, name=name)
    context = {
        "adapter": adapter,
        "api_url": reverse("registry-versions", kwargs={"name": adapter.name}),
        "max_weights_bytes": settings.MAX_ADAPTER_BYTES,
        "max_config_bytes": MAX_CONFIG_BYTES,
    }
    return render_page(request, "web/adapters/upload.html", context)


@require_GET
@scope_required(REGISTRY_READ)
def version_status(request, name, number):
    """A small partial that polls itself (htmx) until the version is ready or rejected."""
    version = selectors.adapter_version_get(
        tenant=request.principal.tenant, adapter_name=name, number=number
    )
    context = {"version": version, "terminal": version.status in TERMINAL}
    return render_page(request, "web/adapters/_version_status.html", context)


@require_POST
@scope_required(REGISTRY_WRITE)
def alias_set_view(request, name, alias):
    """Promote (production), canary with a weight, or roll back: all are pointing an alias."""
    adapter = selectors.adapter_get(tenant=request.principal.tenant, name=name)
    form = AliasSetForm(request.POST)
    if not form.is_valid():
        errors = "; ".join(f"{k}: {' '.join(v)}" for k, v in form.errors.items())
        messages.error(request, f"Could not move {adapter.name}@{alias}: {errors}")
    else:
        try:
            moved, _ = alias_set(
                adapter=adapter,
                name=alias,
                version_number=form.cleaned_data["version"],
                weight=form.cleaned_data["weight"],
                actor=request.principal.label,
            )
        except RegistryError as exc:
            messages.error(request, f"Could not move {adapter.name}@{alias}: {exc.message}")
        else:
            share = f" ({moved.weight}% of traffic)" if moved.weight is not None else ""
            messages.success(
                request, f"{adapter.name}@{alias} now serves v{moved.version.number}{share}."
            )
    return redirect("web:adapter", name=adapter.name)


@require_http_methods(["POST"])
@scope_required(REGISTRY_WRITE)
def alias_delete_view(request, name, alias):
    found = selectors.alias_get(tenant=request.principal.tenant, adapter_name=name, name=alias)
    alias_delete(alias=found, actor=request.principal.label)
    messages.success(request, f"Removed {name}@{alias}.")
    return redirect("web:adapter", name=name)
