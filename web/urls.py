from django.contrib.auth import views as auth_views
from django.urls import path

from .views import account, adapters, keys, playground, usage

app_name = "web"

urlpatterns = [
    path("", account.home, name="home"),
    path(
        "login/",
        auth_views.LoginView.as_view(redirect_authenticated_user=True),
        name="login",
    ),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("tenant/", account.tenant_switch, name="tenant-switch"),
    path("adapters/", adapters.adapters, name="adapters"),
    path("adapters/<str:name>/", adapters.adapter_detail, name="adapter"),
    path("adapters/<str:name>/upload/", adapters.version_upload, name="version-upload"),
    path(
        "adapters/<str:name>/versions/<int:number>/status/",
        adapters.version_status,
        name="version-status",
    ),
    path(
        "adapters/<str:name>/aliases/<str:alias>/",
        adapters.alias_set_view,
        name="alias-set",
    ),
    path(
        "adapters/<str:name>/aliases/<str:alias>/delete/",
        adapters.alias_delete_view,
        name="alias-delete",
    ),
    path("keys/", keys.keys, name="keys"),
    path("keys/<int:key_id>/revoke/", keys.key_revoke, name="key-revoke"),
    path("usage/", usage.usage, name="usage"),
    path("playground/", playground.playground, name="playground"),
]
