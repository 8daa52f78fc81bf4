"""REST endpoints for the caller's tenant and its API keys. Thin: parse, call a service, render."""

from datetime import timedelta

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from .authentication import TenantScope
from .principal import principal_for_request
from .scopes import ALL_SCOPES, KEYS_WRITE, REGISTRY_READ
from .selectors import api_key_get, api_key_list
from .services import api_key_create, api_key_revoke
from .usage import GROUPINGS, usage_totals


class TenantApi(APIView):
    permission_classes = [TenantScope]
    required_scopes: dict[str, str] = {}

    class OutputSerializer(serializers.Serializer):
        slug = serializers.SlugField()
        name = serializers.CharField()
        is_active = serializers.BooleanField()
        created_at = serializers.DateTimeField()

    @extend_schema(responses=OutputSerializer, summary="The caller's tenant")
    def get(self, request):
        return Response(self.OutputSerializer(principal_for_request(request).tenant).data)


class ApiKeyOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    prefix = serializers.CharField()
    scopes = serializers.ListField(child=serializers.CharField())
    created_at = serializers.DateTimeField()
    last_used_at = serializers.DateTimeField(allow_null=True)
    expires_at = serializers.DateTimeField(allow_null=True)
    revoked_at = serializers.DateTimeField(allow_null=True)


class ApiKeyListCreateApi(APIView):
    permission_classes = [TenantScope]
    required_scopes = {"*": KEYS_WRITE}

    class InputSerializer(serializers.Serializer):
        name = serializers.CharField(max_length=100)
        scopes = serializers.ListField(
            child=serializers.ChoiceField(choices=ALL_SCOPES), allow_empty=False
        )
        expires_in_days = serializers.IntegerField(min_value=1, max_value=3650, required=False)

    class CreatedSerializer(ApiKeyOutputSerializer):
        key = serializers.CharField(help_text="The full key. Shown once, never again.")

    @extend_schema(
        responses=ApiKeyOutputSerializer(many=True), summary="List the tenant's API keys"
    )
    def get(self, request):
        keys = api_key_list(tenant=principal_for_request(request).tenant)
        return Response(ApiKeyOutputSerializer(keys, many=True).data)

    @extend_schema(
        request=InputSerializer, responses={201: CreatedSerializer}, summary="Create an API key"
    )
    def post(self, request):
        principal = principal_for_request(request)
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        days = data.validated_data.get("expires_in_days")
        api_key, full = api_key_create(
            tenant=principal.tenant,
            name=data.validated_data["name"],
            scopes=data.validated_data["scopes"],
            created_by=principal.user,
            actor=principal.label,
            expires_at=timezone.now() + timedelta(days=days) if days else None,
            grantable=principal.scopes,
        )
        body = dict(ApiKeyOutputSerializer(api_key).data, key=full)
        return Response(body, status=status.HTTP_201_CREATED)


class ApiKeyDetailApi(APIView):
    permission_classes = [TenantScope]
    required_scopes = {"*": KEYS_WRITE}

    @extend_schema(responses=ApiKeyOutputSerializer, summary="One API key")
    def get(self, request, key_id):
        api_key = api_key_get(tenant=principal_for_request(request).tenant, key_id=key_id)
        return Response(ApiKeyOutputSerializer(api_key).data)

    @extend_schema(
        responses=ApiKeyOutputSerializer, summary="Revoke an API key (effective at once)"
    )
    def delete(self, request, key_id):
        principal = principal_for_request(request)
        api_key = api_key_get(tenant=principal.tenant, key_id=key_id)
        revoked = api_key_revoke(api_key=api_key, actor=principal.label)
        return Response(ApiKeyOutputSerializer(revoked).data)


class UsageApi(APIView):
    """Tokens and requests for the caller's tenant over a period, by adapter or by day."""

    permission_classes = [TenantScope]
    required_scopes = {"*": REGISTRY_READ}

    class UsageQuerySerializer(serializers.Serializer):
        start = serializers.DateTimeField(required=False)
        end = serializers.DateTimeField(required=False)
        group_by = serializers.ChoiceField(choices=list(GROUPINGS), default="adapter")

        def validate(self, data):
            data.setdefault("end", timezone.now())
            if "start" not in data:
                try:
                    data["start"] = data["end"] - timedelta(days=30)
                except OverflowError:  # an end in the first month of year 1
                    raise serializers.ValidationError(
                        {"end": "end is too early; give start as well."}
                    ) from None
            if data["start"] >= data["end"]:
                raise serializers.ValidationError({"start": "start must be before end."})
            return data

    class UsageOutputSerializer(serializers.Serializer):
        group_by = serializers.ChoiceField(choices=list(GROUPINGS))
        # DRF's metaclass moves declared fields out of the class: Serializer.data is intact.
        data = serializers.ListField(  # type: ignore[assignment]
            child=serializers.DictField(),
            help_text=(
                "Rows with adapter and version (null: the base model, under its name) or day, "
                "and requests, prompt/completion/total tokens."
            ),
        )

    @extend_schema(
        parameters=[UsageQuerySerializer],
        responses=UsageOutputSerializer,
        summary="Usage of the caller's tenant",
    )
    def get(self, request):
        params = self.UsageQuerySerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        query = params.validated_data
        rows = usage_totals(
            tenant=principal_for_request(request).tenant,
            start=query["start"],
            end=query["end"],
            by=GROUPINGS[query["group_by"]],
        )
        return Response({"group_by": query["group_by"], "data": rows})
