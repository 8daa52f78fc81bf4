"""REST endpoints of the adapter registry. Thin: parse input, call one service or selector, render.

Reads need `registry:read`, changes `registry:write`. Every tenant-owned object is found
through a tenant-scoped selector, so another tenant's adapter is the same 404 as a missing one.
"""

from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    extend_schema,
    extend_schema_field,
    extend_schema_serializer,
)
from rest_framework import serializers, status
from rest_framework.parsers import JSONParser, MultiPartParser
from rest_framework.response import Response
from rest_framework.views import APIView

from audit.models import AuditEvent
from audit.selectors import audit_event_list
from platform_site.errors import NotFound
from tenants.authentication import TenantScope
from tenants.principal import principal_for_request
from tenants.scopes import REGISTRY_READ, REGISTRY_WRITE

from . import selectors
from .models import Adapter, AdapterVersion, Alias, BaseModel, EvalSet, Evaluation
from .services.adapters import adapter_create, adapter_delete, adapter_update
from .services.aliases import alias_delete, alias_set
from .services.eval_sets import eval_set_attach
from .services.quotas import quota_check
from .services.versions import adapter_version_create
from .uploads import (
    CONFIG_FIELD,
    EVAL_FIELD,
    EVAL_SET_FIELD,
    WEIGHTS_FIELD,
    EvalSetUploadHandler,
    LimitedUploadHandler,
    parse_s3_source,
    s3_import,
)

EVAL_SET_FORMAT = (
    'JSONL, one object per line: {"messages": [{"role", "content"}, ...], "completion": ...} '
    'or {"prompt": ..., "completion": ...}'
)

READ = {"GET": REGISTRY_READ, "HEAD": REGISTRY_READ, "OPTIONS": REGISTRY_READ}
# What VersionOutputSerializer reads of evaluations, prefetched for lists of versions.
EVALUATION_READS = ("evaluations__eval_set", "reference_evaluation")


class RegistryApi(APIView):
    permission_classes = [TenantScope]
    required_scopes = READ | {"*": REGISTRY_WRITE}

    @property
    def principal(self):
        return principal_for_request(self.request)


# ---------------------------------------------------------------- output shapes


class BaseModelOutputSerializer(serializers.ModelSerializer):
    class Meta:
        model = BaseModel
        fields = ["name", "revision", "fingerprint", "is_default", "created_at", "updated_at"]


class AdapterOutputSerializer(serializers.ModelSerializer):
    base_model = serializers.CharField(source="base_model.name")

    class Meta:
        model = Adapter
        fields = ["name", "base_model", "description", "created_by", "created_at", "updated_at"]


class CheckSerializer(serializers.Serializer):
    name = serializers.CharField()
    passed = serializers.BooleanField()
    level = serializers.ChoiceField(choices=["error", "warning"])
    message = serializers.CharField()


class FiguresSerializer(serializers.Serializer):
    tokens = serializers.IntegerField(help_text="completion tokens scored")
    nll = serializers.FloatField(help_text="mean negative log-likelihood per token")
    perplexity = serializers.FloatField(help_text="exp(nll)")


class ReferenceSerializer(serializers.Serializer):
    perplexity = serializers.FloatField(help_text="the adapter's, at its first evaluation")
    base_revision = serializers.CharField()
    evaluated_at = serializers.DateTimeField(allow_null=True)


class RowFiguresSerializer(serializers.Serializer):
    tokens = serializers.IntegerField()
    adapter_nll = serializers.FloatField(allow_null=True, help_text="summed over the row")
    base_nll = serializers.FloatField(allow_null=True, help_text="summed over the row")


class EvaluationOutputSerializer(serializers.ModelSerializer):
    """One evaluation of a version: its eval set's figures under the adapter and the base
    model alone, on one base revision, and the quality gate's verdict."""

    eval_set = serializers.SerializerMethodField(help_text="{sha256, rows, kind}; null: none")
    adapter = serializers.SerializerMethodField()
    base = serializers.SerializerMethodField()
    ratio = serializers.FloatField(
        allow_null=True, help_text="adapter perplexity / the reference (first evaluation)"
    )
    base_ratio = serializers.FloatField(
        allow_null=True, help_text="adapter perplexity / the base model's alone"
    )

    class Meta:
        model = Evaluation
        fields = [
            "status", "trigger", "base_revision", "eval_set", "adapter", "base",
            "reference_perplexity", "ratio", "base_ratio", "reason", "attempts",
            "created_at", "started_at", "finished_at", "duration_seconds",
        ]  # fmt: skip

    def get_eval_set(self, evaluation) -> dict | None:
        eval_set = evaluation.eval_set
        if eval_set is None:
            return None
        return {"sha256": evaluation.eval_set_sha256, "rows": eval_set.rows, "kind": eval_set.kind}

    @extend_schema_field(FiguresSerializer(allow_null=True))
    def get_adapter(self, evaluation) -> dict | None:
        return _figures(
            evaluation.adapter_tokens, evaluation.adapter_nll, evaluation.adapter_perplexity
        )

    @extend_schema_field(FiguresSerializer(allow_null=True))
    def get_base(self, evaluation) -> dict | None:
        return _figures(evaluation.base_tokens, evaluation.base_nll, evaluation.base_perplexity)


def _figures(tokens, nll, perplexity) -> dict | None:
    if perplexity is None:
        return None
    return {"tokens": tokens, "nll": nll, "perplexity": perplexity}


class VersionOutputSerializer(serializers.ModelSerializer):
    adapter = serializers.CharField(source="adapter.name")
    url = serializers.SerializerMethodField()
    target_modules = serializers.ListField(child=serializers.CharField())
    report = CheckSerializer(many=True)
    evaluation = serializers.SerializerMethodField(
        help_text="the newest evaluation (null before the first); `rows` in one version's GET"
    )
    reference = serializers.SerializerMethodField(
        help_text="the figure later evaluations are held to: its first evaluation's"
    )
    override = serializers.SerializerMethodField(
        help_text="an operator's override of a degraded or failed evaluation: {by, at}"
    )

    class Meta:
        model = AdapterVersion
        fields = [
            "adapter", "number", "status", "status_detail", "url", "source",
            "config_sha256", "weights_sha256", "config_size", "weights_size",
            "rank", "alpha", "target_modules", "report",
            "compatible", "checked_revision", "compatibility_detail",
            "quality", "quality_revision", "quality_detail", "evaluation", "reference",
            "override", "attempts", "created_by", "created_at", "validated_at",
        ]  # fmt: skip

    @extend_schema_field(EvaluationOutputSerializer(allow_null=True))
    def get_evaluation(self, version) -> dict | None:
        latest = version.latest_evaluation
        if latest is None:
            return None
        data = EvaluationOutputSerializer(latest).data
        if self.context.get("rows"):
            data["rows"] = RowFiguresSerializer(latest.rows, many=True).data
        return data

    @extend_schema_field(ReferenceSerializer(allow_null=True))
    def get_reference(self, version) -> dict | None:
        reference = version.reference_evaluation
        if reference is None:
            return None
        return {
            "perplexity": reference.adapter_perplexity,
            "base_revision": reference.base_revision,
            "evaluated_at": reference.finished_at,
        }

    def get_override(self, version) -> dict | None:
        if not version.quality_overridden_by:
            return None
        return {"by": version.quality_overridden_by, "at": version.quality_overridden_at}

    def get_url(self, version) -> str:
        path = reverse(
            "registry-version-detail",
            kwargs={"name": version.adapter.name, "number": version.number},
        )
        request = self.context.get("request")
        return request.build_absolute_uri(path) if request else path


class AliasOutputSerializer(serializers.ModelSerializer):
    version = serializers.IntegerField(source="version.number")

    class Meta:
        model = Alias
        fields = ["name", "version", "weight", "updated_by", "updated_at"]


class EvalSetOutputSerializer(serializers.ModelSerializer):
    kind = serializers.CharField(
        read_only=True,
        help_text="own: the adapter's; generic: its base model's, set by the operator",
    )
    base_model = serializers.CharField(
        source="base_model.name",
        allow_null=True,
        read_only=True,
        help_text="the base model whose generic set this is (null for the adapter's own)",
    )

    class Meta:
        model = EvalSet
        fields = ["kind", "base_model", "rows", "size", "sha256", "created_by", "created_at"]


class AuditEventOutputSerializer(serializers.ModelSerializer):
    object = serializers.CharField(source="object_repr")

    class Meta:
        model = AuditEvent
        fields = ["id", "created_at", "actor", "verb", "object_type", "object", "before", "after"]


# ---------------------------------------------------------------- base models


class BaseModelListApi(RegistryApi):
    required_scopes = READ

    @extend_schema(responses=BaseModelOutputSerializer(many=True), summary="Base models")
    def get(self, request):
        return Response(BaseModelOutputSerializer(selectors.base_model_list(), many=True).data)


# ---------------------------------------------------------------- adapters


class AdapterListCreateApi(RegistryApi):
    @extend_schema_serializer(component_name="AdapterCreateInput")
    class InputSerializer(serializers.Serializer):
        name = serializers.CharField(max_length=63, trim_whitespace=False)
        base_model = serializers.CharField(
            required=False, help_text="a base model's name; default: the served one"
        )
        description = serializers.CharField(max_length=2000, required=False, allow_blank=True)

    @extend_schema(responses=AdapterOutputSerializer(many=True), summary="The tenant's adapters")
    def get(self, request):
        adapters = selectors.adapter_list(tenant=self.principal.tenant)
        return Response(AdapterOutputSerializer(adapters, many=True).data)

    @extend_schema(
        request=InputSerializer,
        responses={201: AdapterOutputSerializer},
        summary="Create an adapter",
    )
    def post(self, request):
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        adapter = adapter_create(
            tenant=self.principal.tenant,
            name=data.validated_data["name"],
            base_model_name=data.validated_data.get("base_model"),
            description=data.validated_data.get("description", ""),
            actor=self.principal.label,
        )
        return Response(AdapterOutputSerializer(adapter).data, status=status.HTTP_201_CREATED)


class AdapterDetailApi(RegistryApi):
    @extend_schema_serializer(component_name="AdapterUpdateInput")
    class UpdateSerializer(serializers.Serializer):
        description = serializers.CharField(max_length=2000, allow_blank=True)

    @extend_schema(responses=AdapterOutputSerializer, summary="One adapter")
    def get(self, request, name):
        adapter = selectors.adapter_get(tenant=self.principal.tenant, name=name)
        return Response(AdapterOutputSerializer(adapter).data)

    @extend_schema(
        request=UpdateSerializer, responses=AdapterOutputSerializer, summary="Edit the description"
    )
    def patch(self, request, name):
        adapter = selectors.adapter_get(tenant=self.principal.tenant, name=name)
        data = self.UpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        adapter = adapter_update(
            adapter=adapter,
            description=data.validated_data["description"],
            actor=self.principal.label,
        )
        return Response(AdapterOutputSerializer(adapter).data)

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "force", OpenApiTypes.BOOL, description="delete even while aliases point at it"
            )
        ],
        responses={204: None},
        summary="Delete an adapter, its versions and their files",
    )
    def delete(self, request, name):
        adapter = selectors.adapter_get(tenant=self.principal.tenant, name=name)
        force = request.query_params.get("force", "").lower() in ("1", "true", "yes")
        adapter_delete(adapter=adapter, actor=self.principal.label, force=force)
        return Response(status=status.HTTP_204_NO_CONTENT)


# ---------------------------------------------------------------- versions


class VersionListCreateApi(RegistryApi):
    parser_classes = [MultiPartParser, JSONParser]

    @extend_schema_serializer(component_name="VersionUploadInput")
    class UploadSerializer(serializers.Serializer):
        config = serializers.FileField(help_text="adapter_config.json")
        weights = serializers.FileField(help_text="adapter_model.safetensors")
        eval = serializers.FileField(
            required=False,
            allow_empty_file=True,
            help_text=(
                f"optional: the adapter's eval set, attached in the same call ({EVAL_SET_FORMAT})"
            ),
        )

    @extend_schema_serializer(component_name="VersionImportInput")
    class ImportSerializer(serializers.Serializer):
        # DRF's metaclass moves declared fields out of the class: Field.source is intact.
        source = serializers.CharField(  # type: ignore[assignment]
            max_length=1024, help_text="s3://bucket/prefix/ holding the two PEFT files"
        )

    def initialize_request(self, request, *args, **kwargs):
        # Before anything reads the body (a session's CSRF check may): spill to disk, count bytes.
        if request.method == "POST":
            request.upload_handlers = [LimitedUploadHandler(request)]
        return super().initialize_request(request, *args, **kwargs)

    @extend_schema(responses=VersionOutputSerializer(many=True), summary="An adapter's versions")
    def get(self, request, name):
        adapter = selectors.adapter_get(tenant=self.principal.tenant, name=name)
        versions = selectors.adapter_version_list(tenant=adapter.tenant, adapter_name=adapter.name)
        versions = versions.prefetch_related(*EVALUATION_READS)
        context = {"request": request}
        return Response(VersionOutputSerializer(versions, many=True, context=context).data)

    @extend_schema(
        request={"multipart/form-data": UploadSerializer, "application/json": ImportSerializer},
        responses={202: VersionOutputSerializer, 200: VersionOutputSerializer},
        summary="Upload a version (multipart) or import one from S3 (JSON)",
        description=(
            "Answers 202 with the new pending version and the URL to poll; identical bytes "
            "answer 200 with the existing version. Validation runs in the background. The "
            "tenant's quotas (pending versions, uploads per hour, stored bytes) apply. An "
            "`eval` part becomes the adapter's eval set; it is validated first, so a bad one "
            "refuses the whole upload and stores nothing."
        ),
    )
    def post(self, request, name):
        adapter = selectors.adapter_get(tenant=self.principal.tenant, name=name)
        actor = self.principal.label
        quota_check(tenant=adapter.tenant)  # before reading a body the quota would refuse
        if request.content_type.startswith("multipart/"):
            data = self.UploadSerializer(data=request.data)
            data.is_valid(raise_exception=True)
            version, created = adapter_version_create(
                adapter=adapter,
                config=data.validated_data[CONFIG_FIELD],
                weights=data.validated_data[WEIGHTS_FIELD],
                actor=actor,
                eval_set=data.validated_data.get(EVAL_FIELD),
            )
        else:
            data = self.ImportSerializer(data=request.data)
            data.is_valid(raise_exception=True)
            source = parse_s3_source(data.validated_data["source"], tenant=adapter.tenant)
            with s3_import(source) as (config, weights):
                version, created = adapter_version_create(
                    adapter=adapter, config=config, weights=weights, actor=actor, source=str(source)
                )
        body = VersionOutputSerializer(version, context={"request": request}).data
        code = status.HTTP_202_ACCEPTED if created else status.HTTP_200_OK
        return Response(body, status=code, headers={"Location": body["url"]})


class VersionDetailApi(RegistryApi):
    required_scopes = READ

    @extend_schema(
        responses=VersionOutputSerializer,
        summary="One version: status, report and evaluation",
        description=(
            "`quality` is the quality gate's verdict on `quality_revision` (`pending`, `passed`, "
            "`degraded`, `failed`, `overridden`, or `unevaluated`), `quality_detail` says why; "
            "`evaluation` holds the newest evaluation's figures, here with one entry per eval "
            "set row in `rows`."
        ),
    )
    def get(self, request, name, number):
        version = selectors.adapter_version_get(
            tenant=self.principal.tenant, adapter_name=name, number=number
        )
        context = {"request": request, "rows": True}
        return Response(VersionOutputSerializer(version, context=context).data)


# ---------------------------------------------------------------- eval sets


class EvalSetApi(RegistryApi):
    parser_classes = [MultiPartParser]

    @extend_schema_serializer(component_name="EvalSetUploadInput")
    class UploadSerializer(serializers.Serializer):
        file = serializers.FileField(allow_empty_file=True, help_text=EVAL_SET_FORMAT)

    def initialize_request(self, request, *args, **kwargs):
        # As for version uploads: spill to disk and count bytes before anything reads the body.
        if request.method == "PUT":
            request.upload_handlers = [EvalSetUploadHandler(request)]
        return super().initialize_request(request, *args, **kwargs)

    @extend_schema(
        responses=EvalSetOutputSerializer,
        summary="The eval set the adapter's versions are measured on",
        description="Its own, else its base model's generic one; 404 when there is neither.",
    )
    def get(self, request, name):
        adapter = selectors.adapter_get(tenant=self.principal.tenant, name=name)
        eval_set = selectors.eval_set_for(adapter)
        if eval_set is None:
            raise NotFound(
                f"adapter '{adapter.name}' has no eval set, and base model "
                f"{adapter.base_model.name} has no generic one; PUT one here (multipart "
                f"'{EVAL_SET_FIELD}')"
            )
        return Response(EvalSetOutputSerializer(eval_set).data)

    @extend_schema(
        request={"multipart/form-data": UploadSerializer},
        responses={201: EvalSetOutputSerializer, 200: EvalSetOutputSerializer},
        summary="Attach or replace the adapter's own eval set",
        description=(
            "201 with the new set; 200 when the bytes are those of the current set (nothing "
            "changes). A bad set is refused with the line and field named, and nothing is stored."
        ),
    )
    def put(self, request, name):
        adapter = selectors.adapter_get(tenant=self.principal.tenant, name=name)
        data = self.UploadSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        eval_set, created = eval_set_attach(
            adapter=adapter, file=data.validated_data[EVAL_SET_FIELD], actor=self.principal.label
        )
        code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
        return Response(EvalSetOutputSerializer(eval_set).data, status=code)


# ---------------------------------------------------------------- aliases


class AliasListApi(RegistryApi):
    required_scopes = READ

    @extend_schema(responses=AliasOutputSerializer(many=True), summary="An adapter's aliases")
    def get(self, request, name):
        adapter = selectors.adapter_get(tenant=self.principal.tenant, name=name)
        aliases = selectors.alias_list(tenant=adapter.tenant, adapter_name=adapter.name)
        return Response(AliasOutputSerializer(aliases, many=True).data)


class AliasDetailApi(RegistryApi):
    @extend_schema_serializer(component_name="AliasSetInput")
    class InputSerializer(serializers.Serializer):
        version = serializers.IntegerField(min_value=1)
        weight = serializers.IntegerField(
            min_value=0,
            max_value=100,
            required=False,
            allow_null=True,
            help_text="canary only: percent of requests for the bare adapter name",
        )

    @extend_schema(responses=AliasOutputSerializer, summary="One alias")
    def get(self, request, name, alias):
        found = selectors.alias_get(tenant=self.principal.tenant, adapter_name=name, name=alias)
        return Response(AliasOutputSerializer(found).data)

    @extend_schema(
        request=InputSerializer,
        responses={200: AliasOutputSerializer, 201: AliasOutputSerializer},
        summary="Point an alias at a ready version (rollout, canary, rollback)",
    )
    def put(self, request, name, alias):
        adapter = selectors.adapter_get(tenant=self.principal.tenant, name=name)
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        moved, created = alias_set(
            adapter=adapter,
            name=alias,
            version_number=data.validated_data["version"],
            weight=data.validated_data.get("weight"),
            actor=self.principal.label,
        )
        code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
        return Response(AliasOutputSerializer(moved).data, status=code)

    @extend_schema(responses={204: None}, summary="Remove an alias")
    def delete(self, request, name, alias):
        found = selectors.alias_get(tenant=self.principal.tenant, adapter_name=name, name=alias)
        alias_delete(alias=found, actor=self.principal.label)
        return Response(status=status.HTTP_204_NO_CONTENT)


# ---------------------------------------------------------------- audit


class AuditListApi(RegistryApi):
    required_scopes = READ

    @extend_schema_serializer(component_name="AuditFilter")
    class FilterSerializer(serializers.Serializer):
        verb = serializers.CharField(required=False, max_length=64)
        limit = serializers.IntegerField(required=False, min_value=1, max_value=1000, default=100)

    @extend_schema(
        parameters=[FilterSerializer],
        responses=AuditEventOutputSerializer(many=True),
        summary="The tenant's audit trail, newest first",
    )
    def get(self, request):
        query = self.FilterSerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        events = audit_event_list(
            tenant=self.principal.tenant, verb=query.validated_data.get("verb")
        )[: query.validated_data["limit"]]
        return Response(AuditEventOutputSerializer(events, many=True).data)
