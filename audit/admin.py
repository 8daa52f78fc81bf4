from django.contrib import admin

from .models import AuditEvent


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    """Read-only: the trail is evidence, so nobody adds, edits or deletes events here."""

    list_display = ["created_at", "tenant", "actor", "verb", "object_repr"]
    list_filter = ["verb", "object_type", "tenant"]
    search_fields = ["actor", "verb", "object_repr", "tenant__slug"]
    date_hierarchy = "created_at"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    has_delete_permission = has_change_permission
