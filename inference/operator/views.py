"""The operator endpoints over HTTP: thin async views."""

from functools import partial

from asgiref.sync import sync_to_async
from django.http import JsonResponse

from inference.http import json_endpoint, require_method
from inference.metrics import HTTP_REQUESTS
from platform_site import operator_protocol as protocol
from registry.services.registrations import AdapterRejected

from . import lora_adapters, scoring
from .authorization import authorize
from .calls import parse_call


async def _operate(request, action: str, perform) -> JsonResponse:
    actor = await sync_to_async(authorize)(request)
    require_method(request, "POST")
    call = parse_call(request.body or b"{}", action=action)
    try:
        done = await perform(call, actor)
    except AdapterRejected as exc:  # answered with the whole validation report
        HTTP_REQUESTS.labels(endpoint="refused", status=str(exc.status)).inc()
        return lora_adapters.rejection_response(exc)
    return JsonResponse(
        {protocol.LORA_NAME: call.lora_name, "action": action, "status": "ok", **done}
    )


@json_endpoint
async def load_lora_adapter(request):
    return await _operate(request, protocol.LOAD, lora_adapters.load)


@json_endpoint
async def unload_lora_adapter(request):
    return await _operate(request, protocol.UNLOAD, lora_adapters.unload)


@json_endpoint
async def pin_lora_adapter(request):
    return await _operate(request, protocol.PIN, partial(lora_adapters.set_pinned, pinned=True))


@json_endpoint
async def unpin_lora_adapter(request):
    return await _operate(request, protocol.UNPIN, partial(lora_adapters.set_pinned, pinned=False))


@json_endpoint
async def lora_adapters_list(request):
    await sync_to_async(authorize)(request)
    require_method(request, "GET")
    return JsonResponse({"object": "list", "data": await lora_adapters.list_adapters()})


@json_endpoint
async def score(request):
    await sync_to_async(authorize)(request)
    require_method(request, "POST")
    return JsonResponse(await scoring.score_request(request.body or b""))
