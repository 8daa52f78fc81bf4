"""Operators' admin. The key's secret is never stored, so it can never be shown here."""

from django.contrib import admin, messages

from .models import ApiKey, Membership, Tenant
from .services import api_key_revoke, tenant_set_active


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "is_active", "created_at"]
    list_filter = ["is_active"]
    search_fields = ["slug", "name"]
    inlines = [MembershipInline]
    actions = ["suspend", "reactivate"]

    @admin.action(description="Suspend selected tenants (their keys stop working)")
    def suspend(self, request, queryset):
        for tenant in queryset:
            tenant_set_active(tenant=tenant, active=False)
        messages.success(request, f"Suspended {queryset.count()} tenant(s).")

    @admin.action(description="Reactivate selected tenants")
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
        "scopes",
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

    @admin.action(description="Revoke selected API keys")
    def revoke(self, request, queryset):
        for api_key in queryset:
            api_key_revoke(api_key=api_key, actor=f"admin:{request.user.get_username()}")
        messages.success(request, f"Revoked {queryset.count()} key(s).")
