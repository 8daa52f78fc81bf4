"""The playground: chat with an adapter and the base model side by side.

The page's script calls `POST /v1/chat/completions` with `stream: true` itself, signed in
by the session and the CSRF token; nothing here talks to the engine.
"""

from django.views.decorators.http import require_GET

from tenants.scopes import INFERENCE

from ..decorators import scope_required
from ..pages import render_page
from ..selectors import playground_models


@require_GET
@scope_required(INFERENCE)
def playground(request):
    models = playground_models(tenant=request.principal.tenant)
    wanted = request.GET.get("model", "")
    known = {c.value for c in models.adapters}
    context = {
        "models": models,
        "selected": wanted
        if wanted in known
        else (models.adapters[0].value if models.adapters else ""),
    }
    return render_page(request, "web/playground.html", context)
