"""GET /v1/models for one tenant: the base models, each adapter, and each adapter@alias; and
GET /v1/models/{model}, one of those (the same names, so the two never disagree).

`max_model_len` (vLLM's field: prompt plus completion tokens) is the context of the engine
that serves the model's base. A replica knows its own; for a model of another base it is
null (that base's replicas, through the router's route for it, know theirs).
"""

from collections.abc import Mapping

from inference.errors import ModelNotFound
from registry.model_names import alias_name
from registry.selectors import adapters_with_ready_versions, alias_list, base_model_list


def models_for_tenant(*, tenant, contexts: Mapping[str, int] | None = None) -> list[dict]:
    """Every base model, then the tenant's adapters (with a ready version) and aliases on
    any of them, `parent` naming the base model each runs on. The whole deployment's list,
    whichever replica answers: a model of another base than the answering replica's is
    served through the router's route for its base (docker/haproxy.cfg). `contexts`: base
    model name -> max_model_len, for the bases this replica serves."""
    contexts = contexts or {}
    bases = list(base_model_list().order_by("name"))
    data = [
        {
            "id": base.name,
            "object": "model",
            "created": int(base.created_at.timestamp()),
            "owned_by": "loraplex",
            "root": base.name,
            "parent": None,
            "max_model_len": contexts.get(base.name),
        }
        for base in bases
    ]
    adapters = adapters_with_ready_versions(tenant=tenant)
    for adapter in adapters.order_by("name"):
        data.append(_entry(adapter.name, adapter, tenant, contexts))
    aliases = alias_list(tenant=tenant).select_related("adapter__base_model")
    for alias in aliases.order_by("adapter__name", "name"):
        data.append(_entry(alias_name(alias, qualified=False), alias.adapter, tenant, contexts))
    return data


def model_for_tenant(*, tenant, model_id: str, contexts: Mapping[str, int] | None = None) -> dict:
    """The listed model named `model_id`; another tenant's is as unknown as a missing one."""
    for model in models_for_tenant(tenant=tenant, contexts=contexts):
        if model["id"] == model_id:
            return model
    raise ModelNotFound(model_id, param="model")


def _entry(model_id: str, adapter, tenant, contexts: Mapping[str, int]) -> dict:
    base_name = adapter.base_model.name
    return {
        "id": model_id,
        "object": "model",
        "created": int(adapter.created_at.timestamp()),
        "owned_by": tenant.slug,
        "root": base_name,
        "parent": base_name,
        "max_model_len": contexts.get(base_name),
    }
