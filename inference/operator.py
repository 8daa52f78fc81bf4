"""Operator endpoints, shaped like vLLM's (`/v1/load_lora_adapter` ...), for staff only.

`lora_name` names a registry version as `<tenant>/<adapter>[@alias|:n]`, so an operator
warms exactly what tenants' requests will resolve to; loading also pins it (popular
adapters stay hot), unpinning lets the LRU evict it again.
"""

import hmac

from asgiref.sync import sync_to_async
from django.conf import settings

from tenants.keyauth import KeyRejected, bearer_token
from tenants.models import Tenant

from .engine_host import HOST, EngineUnavailable
from .resolution import ModelNotFound, ModelNotServable, resolve_model

ACTIONS = ("load_lora_adapter", "unload_lora_adapter", "pin_lora_adapter", "unpin_lora_adapter")


def authorize(request) -> None:
    from .generation import ApiFailure

    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated and user.is_staff:
        return
    token = settings.OPERATOR_TOKEN
    try:
        given = bearer_token(request.META.get("HTTP_AUTHORIZATION"))
    except KeyRejected as exc:
        raise ApiFailure(exc.status, exc.code, exc.message) from None
    if not token or not hmac.compare_digest(given.encode(), token.encode()):
        raise ApiFailure(403, "operator_only", "Operator endpoints need a staff session or the operator token.")


def resolve_operator_name(lora_name) -> object:
    """`tenant/adapter[@alias|:n]` -> a LoRARequest for that version."""
    from .generation import ApiFailure

    if not isinstance(lora_name, str) or "/" not in lora_name:
        raise ApiFailure(400, "invalid_request", "lora_name must read '<tenant>/<adapter>[@alias|:n]'.",
                         param="lora_name")
    slug, _, name = lora_name.partition("/")
    tenant = Tenant.objects.filter(slug=slug).first()
    try:
        if tenant is None:
            raise ModelNotFound(lora_name)
        resolved = resolve_model(tenant=tenant, name=name, base_model_name=HOST.model.name, roll=1.0)
    except ModelNotFound:
        raise ApiFailure(404, "model_not_found", f"No adapter '{lora_name}'.", param="lora_name") from None
    except ModelNotServable as exc:
        raise ApiFailure(409, "model_not_servable", str(exc), param="lora_name") from None
    if resolved.version is None:
        raise ApiFailure(400, "invalid_request", "That is the base model; it is always loaded.", param="lora_name")
    return resolved.lora_request


async def perform(action: str, body: dict) -> dict:
    from .generation import ApiFailure

    if action not in ACTIONS:
        raise ApiFailure(404, "not_found", f"Unknown operator action '{action}'.")
    try:
        engine = HOST.engine or await sync_to_async(HOST.start, thread_sensitive=False)()
    except EngineUnavailable as exc:
        raise ApiFailure(503, "engine_unavailable", str(exc)) from None
    lora = await sync_to_async(resolve_operator_name)(body.get("lora_name"))
    if action == "load_lora_adapter":
        await engine.load_lora(lora, pin=True)
    elif action == "unload_lora_adapter":
        await engine.unload_lora(lora.adapter_id)
    else:
        await engine.pin_lora(lora.adapter_id, pinned=action == "pin_lora_adapter")
    return {"lora_name": body["lora_name"], "action": action, "status": "ok"}


async def list_adapters() -> list[dict]:
    engine = HOST.engine
    return [] if engine is None else await engine.list_loras()
