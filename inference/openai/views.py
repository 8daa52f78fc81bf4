"""The OpenAI-compatible HTTP API: thin async views over the serving flows."""

import json

from asgiref.sync import sync_to_async
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse

from inference.auth import inference_principal
from inference.http import json_endpoint, require_method
from tenants.scopes import INFERENCE

from .generation import Endpoint, prepare, respond_json, respond_stream
from .serving_chat import CHAT
from .serving_completion import COMPLETIONS
from .serving_models import model_for_tenant, models_for_tenant


async def _generate(request, endpoint: Endpoint):
    require_method(request, "POST")
    prepared = await prepare(request, endpoint)
    if prepared.stream:
        response = StreamingHttpResponse(respond_stream(prepared), content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # tell nginx-style proxies not to buffer tokens
        return response
    body = await respond_json(prepared)
    # A body of many choices and logprobs can take megabytes: written off the event loop.
    content = await sync_to_async(json.dumps, thread_sensitive=False)(body)
    return HttpResponse(content, content_type="application/json")


@json_endpoint
async def chat_completions(request):
    return await _generate(request, CHAT)


@json_endpoint
async def completions(request):
    return await _generate(request, COMPLETIONS)


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
