"""The engine's side of the operator protocol (inference/operator_protocol.py), for operators
only: the operator token, or a staff session with the `registry.operate_engines` permission.

`lora_name` names a registry version as `<tenant>/<adapter>[@alias|:n]`
(registry/model_names.py), so an operator warms exactly what tenants' requests will resolve
to; loading also pins it (popular adapters stay hot), unpinning lets the LRU evict it again.
"""

import hmac

from asgiref.sync import sync_to_async
from django.conf import settings

from registry.model_names import parse_qualified_name
from registry.permissions import OPERATE_ENGINES, can_operate_engines
from tenants.keyauth import bearer_token
from tenants.models import Tenant

from .auth import require_csrf
from .engine_host import HOST
from .errors import ModelNotFound, OperatorOnly, ProtocolError
from .operator_protocol import LORA_NAME
from .resolution import resolve_model

# What the listing shows of each adapter; not where its files sit on the engine's disk.
LISTED_FIELDS = (
    "name",
    "adapter_id",
    "tier",
    "slot",
    "pinned",
    "loading",
    "rank",
    "running",
    "waiting",
)


def authorize(request) -> None:
    """A session (no Authorization header) needs the permission and, to change anything, the
    page's CSRF token: a staff member's browser must not be driven by another site."""
    header = request.META.get("HTTP_AUTHORIZATION")
    user = getattr(request, "user", None)
    if not header and user is not None and user.is_authenticated:
        if not can_operate_engines(user):
            raise OperatorOnly(f"Operator endpoints need the {OPERATE_ENGINES} permission.")
        require_csrf(request)
        return
    given = bearer_token(header)
    token = settings.OPERATOR_TOKEN
    if not token or not hmac.compare_digest(given.encode(), token.encode()):
        raise OperatorOnly(
            "Operator endpoints need the operator token, or a staff session with the "
            f"{OPERATE_ENGINES} permission."
        )


def resolve_operator_name(lora_name) -> object:
    """`tenant/adapter[@alias|:n]` -> a LoRARequest for that version."""
    ref = parse_qualified_name(lora_name)
    if ref is None:
        raise ProtocolError(
            f"{LORA_NAME} must read '<tenant>/<adapter>[@alias|:n]'.", param=LORA_NAME
        )
    tenant = Tenant.objects.filter(slug=ref.tenant).first()
    if tenant is None:
        raise ModelNotFound(lora_name, param=LORA_NAME)
    assert HOST.model is not None, "callers start the engine first"
    resolved = resolve_model(
        tenant=tenant, name=ref.model, base_model_name=HOST.model.name, roll=1.0, param=LORA_NAME
    )
    if resolved.version is None:
        raise ProtocolError("That is the base model; it is always loaded.", param=LORA_NAME)
    return resolved.lora_request


async def _engine_and_adapter(lora_name):
    engine = HOST.engine or await sync_to_async(HOST.start, thread_sensitive=False)()
    return engine, await sync_to_async(resolve_operator_name)(lora_name)


async def load(lora_name) -> None:
    """Load and pin: it stays hot until unpinned."""
    engine, lora = await _engine_and_adapter(lora_name)
    await engine.load_lora(lora, pin=True)


async def unload(lora_name) -> None:
    engine, lora = await _engine_and_adapter(lora_name)
    await engine.unload_lora(lora.adapter_id)


async def set_pinned(lora_name, *, pinned: bool) -> None:
    """Pinning an adapter the engine has not loaded yet loads it (the admin pins versions
    before their first request); unpinning one it does not hold is a 400 from the engine."""
    engine, lora = await _engine_and_adapter(lora_name)
    if pinned:
        await engine.load_lora(lora, pin=True)
    else:
        await engine.pin_lora(lora.adapter_id, pinned=False)


async def list_adapters() -> list[dict]:
    engine = HOST.engine
    loaded = [] if engine is None else await engine.list_loras()
    return [{k: v for k, v in adapter.items() if k in LISTED_FIELDS} for adapter in loaded]
