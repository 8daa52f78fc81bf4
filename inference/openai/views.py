"""The OpenAI-compatible HTTP API and the engine's operator endpoints. Thin async views.

Each view raises what refuses a request; `json_endpoint` answers it through the one error
mapping (platform_site/error_responses.py), in OpenAI's error shape.
"""

from functools import partial, wraps

from asgiref.sync import sync_to_async
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from platform_site.error_responses import json_error_response
from platform_site.errors import MethodNotAllowed
from tenants.scopes import INFERENCE

from . import metrics, operator
from . import operator_protocol as protocol
from .auth import authorize_scrape, inference_principal
from .generation import prepare, respond_json, respond_stream
from .models_list import model_for_tenant, models_for_tenant


def json_endpoint(view):
    """CSRF-exempt (API clients send no cookies; inference/auth.py checks sessions itself),
    and any exception becomes its JSON answer, counted as refused."""

    @csrf_exempt
    @wraps(view)
    async def answer(request, *args, **kwargs):
        try:
            return await view(request, *args, **kwargs)
        except Exception as exc:
            response = json_error_response(exc)
            metrics.HTTP_REQUESTS.labels(endpoint="refused", status=str(response.status_code)).inc()
            return response

    return answer


def require_method(request, method: str) -> None:
    if request.method != method:
        raise MethodNotAllowed(f"Use {method}.", headers={"Allow": method})


# ---------------------------------------------------------------- OpenAI-compatible


async def _generate(request, kind: str):
    require_method(request, "POST")
    prepared = await prepare(request, kind)
    if prepared.stream:
        response = StreamingHttpResponse(respond_stream(prepared), content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # tell nginx-style proxies not to buffer tokens
        return response
    return JsonResponse(await respond_json(prepared))


@json_endpoint
async def chat_completions(request):
    return await _generate(request, "chat")


@json_endpoint
async def completions(request):
    return await _generate(request, "text")


@json_endpoint
async def models(request):
    require_method(request, "GET")
    principal = await sync_to_async(inference_principal)(request, scope=INFERENCE)
    data = await sync_to_async(models_for_tenant)(tenant=principal.tenant)
    return JsonResponse({"object": "list", "data": data})


@json_endpoint
async def model(request, model_id: str):
    require_method(request, "GET")
    principal = await sync_to_async(inference_principal)(request, scope=INFERENCE)
    found = await sync_to_async(model_for_tenant)(tenant=principal.tenant, model_id=model_id)
    return JsonResponse(found)


@json_endpoint
async def prometheus_metrics(request):
    require_method(request, "GET")
    authorize_scrape(request)
    body = await sync_to_async(metrics.render)()  # some collectors read the database
    return HttpResponse(body, content_type="text/plain; version=0.0.4; charset=utf-8")


# ---------------------------------------------------------------- operators (inference/operator.py)


async def _operate(request, action: str, perform) -> JsonResponse:
    actor = await sync_to_async(operator.authorize)(request)
    require_method(request, "POST")
    call = operator.parse_call(request.body or b"{}", action=action)
    try:
        done = await perform(call, actor)
    except operator.AdapterRejected as exc:  # answered with the whole validation report
        metrics.HTTP_REQUESTS.labels(endpoint="refused", status=str(exc.status)).inc()
        return operator.rejection_response(exc)
    return JsonResponse(
        {protocol.LORA_NAME: call.lora_name, "action": action, "status": "ok", **done}
    )


@json_endpoint
async def load_lora_adapter(request):
    return await _operate(request, protocol.LOAD, operator.load)


@json_endpoint
async def unload_lora_adapter(request):
    return await _operate(request, protocol.UNLOAD, operator.unload)


@json_endpoint
async def pin_lora_adapter(request):
    return await _operate(request, protocol.PIN, partial(operator.set_pinned, pinned=True))


@json_endpoint
async def unpin_lora_adapter(request):
    return await _operate(request, protocol.UNPIN, partial(operator.set_pinned, pinned=False))


@json_endpoint
async def lora_adapters(request):
    await sync_to_async(operator.authorize)(request)
    require_method(request, "GET")
    return JsonResponse({"object": "list", "data": await operator.list_adapters()})
