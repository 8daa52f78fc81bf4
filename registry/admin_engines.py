"""The operators' read-only engines page: loaded adapters by tier, slots, KV cache, hit rates."""

from django.contrib import admin
from django.template.response import TemplateResponse

from .engines import engine_state, engine_urls


def engines_page(request):
    """Staff only (wrapped by `admin.site.admin_view` in the URLconf)."""
    states = [engine_state(url) for url in engine_urls()]
    context = {
        **admin.site.each_context(request),
        "title": "Engines",
        "states": states,
        "configured": bool(states),
    }
    return TemplateResponse(request, "admin/engines.html", context)
