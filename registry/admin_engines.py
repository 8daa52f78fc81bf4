"""The operators' read-only engines page: loaded adapters by tier, slots, KV cache, adapter
and prefix cache hit rates, and the capacity plan for each engine's model and device."""

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.template.response import TemplateResponse

from .capacity import engine_plan
from .engines import engine_state, engine_urls
from .permissions import OPERATE_ENGINES, can_operate_engines


def engines_page(request):
    """Staff only (wrapped by `admin.site.admin_view` in the URLconf), with the permission to
    operate the engines: what each engine holds names every tenant's adapters."""
    if not can_operate_engines(request.user):
        raise PermissionDenied(f"The Engines page needs the {OPERATE_ENGINES} permission.")
    states = [engine_state(url) for url in engine_urls()]
    engines = [(state, engine_plan(state)) for state in states]  # the plan beside each
    context = {
        **admin.site.each_context(request),
        "title": "Engines",
        "engines": engines,
        "configured": bool(states),
    }
    return TemplateResponse(request, "admin/engines.html", context)
