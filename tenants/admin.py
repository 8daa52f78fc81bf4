"""Operators' admin. The key's secret is never stored, so it can never be shown here.

Actions need the model's change permission: a staff user who may only view acts on nothing.
"""

from django.contrib import admin, messages
from django.db.models import Count, Q

from platform_site.admin_columns import count_column

from .models import ApiKey, Membership, Tenant, UsageRecord
from .services import api_key_revoke, tenant_set_active


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "is_active", "members", "adapters", "live_keys", "created_at"]
    list_filter = ["is_active"]
    search_fields = ["slug", "name"]
    inlines = [MembershipInline]
    fieldsets = [
        (None, {"fields": ["slug", "name", "is_active"]}),
        (
            "Adapter imports and quotas",
            {
                "fields": [
                    "s3_import_prefixes",
                    "max_pending_versions",
                    "max_uploads_per_hour",
                    "max_adapter_bytes",
                ],
                "description": "Quotas left empty take the deployment's default; 0 is no limit.",
            },
        ),
    ]
    actions = ["suspend", "reactivate"]

    members = count_column("n_members", description="members")
    adapters = count_column("n_adapters", description="adapters")
    live_keys = count_column("n_live_keys", description="unrevoked keys")

    def get_queryset(self, request):
        live = Q(api_keys__revoked_at__isnull=True)
        return (
            super()
            .get_queryset(request)
            .annotate(
                n_members=Count("memberships", distinct=True),
                n_adapters=Count("adapters", distinct=True),
                n_live_keys=Count("api_keys", filter=live, distinct=True),
            )
        )

    @admin.action(
        description="Suspend selected tenants (their keys stop working)", permissions=["change"]
    )
    def suspend(self, request, queryset):
        for tenant in queryset:
            tenant_set_active(tenant=tenant, active=False)
        messages.success(request, f"Suspended {queryset.count()} tenant(s).")

    @admin.action(description="Reactivate selected tenants", permissions=["change"])
    def reactivate(self, request, queryset):
        for tenant in queryset:
            tenant_set_active(tenant=tenant, active=True)
        messages.success(request, f"Reactivated {queryset.count()} tenant(s).")


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "tenant", "role", "created_at"]
    list_filter = ["role", "tenant"]
    search_fields = ["user__username", "user__email", "tenant__slug"]
    autocomplete_fields = ["user", "tenant"]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "tenant",
        "prefix",
        "state",
        "scopes",
        "created_by",
        "created_at",
        "last_used_at",
        "expires_at",
        "revoked_at",
    ]
    list_filter = ["tenant", ("revoked_at", admin.EmptyFieldListFilter), "expires_at"]
    search_fields = ["name", "prefix", "tenant__slug"]
    readonly_fields = ["prefix", "created_by", "created_at", "last_used_at", "revoked_at"]
    exclude = ["hashed_key"]
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False  # keys are created where the secret can be shown once: the API or a command

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("tenant", "created_by")

    @admin.display(description="state")
    def state(self, obj):
        return "revoked" if obj.is_revoked else "expired" if obj.is_expired else "active"

    @admin.action(description="Revoke selected API keys", permissions=["change"])
    def revoke(self, request, queryset):
        for api_key in queryset:
            api_key_revoke(api_key=api_key, actor=f"admin:{request.user.get_username()}")
        messages.success(request, f"Revoked {queryset.count()} key(s).")


@admin.register(UsageRecord)
class UsageRecordAdmin(admin.ModelAdmin):
    """Metered requests, read-only: the meter writes them, nobody edits them."""

    list_display = [
        "created_at",
        "tenant",
        "model",
        "adapter_version",
        "endpoint",
        "status",
        "prompt_tokens",
        "completion_tokens",
        "ttft_ms",
        "duration_ms",
        "api_key",
    ]
    list_filter = ["status", "endpoint", "tenant"]
    search_fields = ["model", "tenant__slug", "api_key__prefix"]
    date_hierarchy = "created_at"
    list_select_related = ["tenant", "api_key", "adapter_version__adapter__tenant"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
