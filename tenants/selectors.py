"""Reads, always scoped to one tenant: the single place tenant isolation is enforced for keys."""

from django.db.models import Count, QuerySet
from django.http import Http404

from .models import ApiKey, Membership, Tenant, UsageRecord


def api_key_list(*, tenant: Tenant) -> QuerySet[ApiKey]:
    return ApiKey.objects.filter(tenant=tenant).select_related("created_by")


def api_key_get(*, tenant: Tenant, key_id) -> ApiKey:
    """Another tenant's key is indistinguishable from a missing one (404, never 403)."""
    try:
        return api_key_list(tenant=tenant).get(pk=int(key_id))
    except (ApiKey.DoesNotExist, ValueError, TypeError):
        raise Http404("No such API key.") from None


def memberships_for_user(user) -> QuerySet[Membership]:
    return Membership.objects.filter(user=user).select_related("tenant")


def membership_for(*, user, tenant_slug: str | None) -> Membership | None:
    """The membership a signed-in user acts through: the chosen tenant, else their first one."""
    memberships = memberships_for_user(user).order_by("tenant__slug")
    if tenant_slug:
        return memberships.filter(tenant__slug=tenant_slug).first()
    return memberships.first()


def tenant_find(*, slug: str) -> Tenant | None:
    """For operators, who name tenants by slug: not scoped to a caller."""
    return Tenant.objects.filter(slug=slug).first()


def requests_per_adapter(*, since) -> dict[int, int]:
    """Requests metered since `since`, per adapter (by id; every version of it together),
    for every tenant: the capacity planner's traffic mix. Base-model requests are left out."""
    rows = (
        UsageRecord.objects.filter(created_at__gte=since, adapter_version__isnull=False)
        .values("adapter_version__adapter_id")
        .annotate(requests=Count("id"))
    )
    return {row["adapter_version__adapter_id"]: row["requests"] for row in rows}
