from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from . import health

# Every app's routes by name (strings, not imports): the project mounts the apps, the apps
# import the project's modules, never the other way round.
urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("admin/", include("registry.admin_urls")),  # before the admin's catch-all
    path("admin/", admin.site.urls),
    path("api/v1/", include("tenants.urls")),
    path("api/v1/", include("registry.urls")),
    path("v1/", include("inference.urls")),
    path("", include("inference.root_urls")),  # /metrics, /tokenize, /detokenize
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
    path("", include("web.urls")),  # the tenant members' pages: last, they own the root
]

# What no view answers: JSON in OpenAI's error shape under /v1/ and /api/, HTML elsewhere.
handler400 = "platform_site.error_pages.bad_request"
handler403 = "platform_site.error_pages.permission_denied"
handler404 = "platform_site.error_pages.page_not_found"
handler500 = "platform_site.error_pages.server_error"
