from django.urls import include, path

from . import apis

adapter_urls = [
    path("", apis.AdapterDetailApi.as_view(), name="registry-adapter-detail"),
    path("versions/", apis.VersionListCreateApi.as_view(), name="registry-versions"),
    path("versions/<int:number>/", apis.VersionDetailApi.as_view(), name="registry-version-detail"),
    path("eval-set/", apis.EvalSetApi.as_view(), name="registry-eval-set"),
    path("aliases/", apis.AliasListApi.as_view(), name="registry-aliases"),
    path("aliases/<str:alias>/", apis.AliasDetailApi.as_view(), name="registry-alias-detail"),
]

urlpatterns = [
    path("base-models/", apis.BaseModelListApi.as_view(), name="registry-base-models"),
    path("adapters/", apis.AdapterListCreateApi.as_view(), name="registry-adapters"),
    path("adapters/<str:name>/", include(adapter_urls)),
    path("audit/", apis.AuditListApi.as_view(), name="registry-audit"),
]
