"""GET /v1/models for one tenant: the base model, each adapter, and each adapter@alias; and
GET /v1/models/{model}, one of those (the same names, so the two never disagree)."""

from registry.model_names import alias_name
from registry.models import AdapterVersion
from registry.selectors import adapter_list, alias_list, base_model_served

from .errors import ModelNotFound


def models_for_tenant(*, tenant) -> list[dict]:
    base = base_model_served()
    if base is None:
        return []
    created = int(base.created_at.timestamp())
    data = [
        {
            "id": base.name,
            "object": "model",
            "created": created,
            "owned_by": "loraplex",
            "root": base.name,
            "parent": None,
        }
    ]
    ready = set(
        AdapterVersion.objects.filter(
            adapter__tenant=tenant, status=AdapterVersion.READY
        ).values_list("adapter_id", flat=True)
    )
    for adapter in (
        adapter_list(tenant=tenant).filter(base_model=base, id__in=ready).order_by("name")
    ):
        data.append(_entry(adapter.name, adapter, tenant, base.name))
    for alias in (
        alias_list(tenant=tenant).filter(adapter__base_model=base).order_by("adapter__name", "name")
    ):
        data.append(_entry(alias_name(alias, qualified=False), alias.adapter, tenant, base.name))
    return data


def model_for_tenant(*, tenant, model_id: str) -> dict:
    """The listed model named `model_id`; another tenant's is as unknown as a missing one."""
    for model in models_for_tenant(tenant=tenant):
        if model["id"] == model_id:
            return model
    raise ModelNotFound(model_id, param="model")


def _entry(model_id: str, adapter, tenant, base_name: str) -> dict:
    return {
        "id": model_id,
        "object": "model",
        "created": int(adapter.created_at.timestamp()),
        "owned_by": tenant.slug,
        "root": base_name,
        "parent": base_name,
    }
