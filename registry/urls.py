from django.urls import path

from . import apis

urlpatterns = [
    path("base-models/", apis.BaseModelListApi.as_view(), name="registry-base-models"),
    path("adapters/", apis.AdapterListCreateApi.as_view(), name="registry-adapters"),
    path("adapters/<str:name>/", apis.AdapterDetailApi.as_view(), name="registry-adapter-detail"),
    path(
        "adapters/<str:name>/versions/",
        apis.VersionListCreateApi.as_view(),
        name="registry-versions",
    ),
    path(
        "adapters/<str:name>/versions/<int:number>/",
        apis.VersionDetailApi.as_view(),
        name="registry-version-detail",
    ),
    path("adapters/<str:name>/eval-set/", apis.EvalSetApi.as_view(), name="registry-eval-set"),
    path("adapters/<str:name>/aliases/", apis.AliasListApi.as_view(), name="registry-aliases"),
    path(
        "adapters/<str:name>/aliases/<str:alias>/",
        apis.AliasDetailApi.as_view(),
        name="registry-alias-detail",
    ),
    path("audit/", apis.AuditListApi.as_view(), name="registry-audit"),
]
