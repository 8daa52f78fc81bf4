from django.urls import path

from . import apis

urlpatterns = [
    path("tenant/", apis.TenantApi.as_view(), name="api-tenant"),
    path("keys/", apis.ApiKeyListCreateApi.as_view(), name="api-keys"),
    path("keys/<int:key_id>/", apis.ApiKeyDetailApi.as_view(), name="api-key-detail"),
    path("usage/", apis.UsageApi.as_view(), name="api-usage"),
]
