"""The operator actions on adapters: load (and pin), unload, pin, unpin, list.

Loading also pins (popular adapters stay hot); unpinning lets the LRU evict it again. A load
with `lora_path` answers once the version the files became may serve, or with the
validation report.
"""

from asgiref.sync import sync_to_async
from django.http import JsonResponse

from inference.host.engine_host import HOST
from inference.host.lora_loading import (
    OperatorCall,
    adapter_target,
    load_version,
    register_and_await,
    resolve_operator_name,
    source_of,
)
from platform_site.error_responses import error_body
from registry.services.registrations import AdapterRejected

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


def rejection_response(exc: AdapterRejected) -> JsonResponse:
    """The error answer, with the version the files became and its report (every check)."""
    body = error_body(exc)
    body["error"].update(exc.details)
    return JsonResponse(body, status=exc.status)


async def _engine_and_adapter(lora_name):
    engine = await HOST.started_engine()
    return engine, await sync_to_async(resolve_operator_name)(lora_name)


async def load(call: OperatorCall, actor: str) -> dict:
    """Load and pin: it stays hot until unpinned. With `lora_path`, the files first."""
    if call.lora_path is None:
        engine, lora = await _engine_and_adapter(call.lora_name)
        await engine.load_lora(lora, pin=True)
        return {}
    adapter_target(call.lora_name)  # a bad name is refused before any file is looked at
    source = await sync_to_async(source_of)(call.lora_path)
    engine = await HOST.started_engine()
    registration, lora = await sync_to_async(register_and_await)(call, source, actor=actor)
    await load_version(engine, lora)
    return {"version": lora.name, "created": registration.created}


async def unload(call: OperatorCall, actor: str) -> dict:
    engine, lora = await _engine_and_adapter(call.lora_name)
    await engine.unload_lora(lora.adapter_id)
    return {}


async def set_pinned(call: OperatorCall, actor: str, *, pinned: bool) -> dict:
    """Pinning an adapter the engine has not loaded yet loads it (the admin pins versions
    before their first request); unpinning one it does not hold is a 400 from the engine."""
    engine, lora = await _engine_and_adapter(call.lora_name)
    if pinned:
        await engine.load_lora(lora, pin=True)
    else:
        await engine.pin_lora(lora.adapter_id, pinned=False)
    return {}


async def list_adapters() -> list[dict]:
    engine = HOST.engine
    loaded = [] if engine is None else await engine.list_loras()
    return [{k: v for k, v in adapter.items() if k in LISTED_FIELDS} for adapter in loaded]
