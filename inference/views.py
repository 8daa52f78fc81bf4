"""The OpenAI-compatible HTTP API and the engine's operator endpoints. Thin async views."""

import json

from asgiref.sync import sync_to_async
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from platform_site.errors import error_body
from tenants.keyauth import KeyRejected
from tenants.scopes import INFERENCE

from . import metrics, operator
from .auth import inference_principal
from .generation import ApiFailure, prepare, respond_json, respond_stream
from .models_list import models_for_tenant


def failure_response(exc: ApiFailure) -> JsonResponse:
    body = error_body(exc.message, code=exc.code, status_code=exc.status, param=exc.param)
    response = JsonResponse(body, status=exc.status)
    for name, value in exc.headers.items():
        response[name] = value
    if exc.status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="loraplex"'
    metrics.HTTP_REQUESTS.labels(endpoint="refused", status=str(exc.status)).inc()
    return response


def _method_not_allowed(allowed: str) -> JsonResponse:
    response = JsonResponse(error_body(f"Use {allowed}.", code="method_not_allowed", status_code=405), status=405)
    response["Allow"] = allowed
    return response


async def _generate(request, kind: str):
    if request.method != "POST":
        return _method_not_allowed("POST")
    try:
        prepared = await prepare(request, kind)
        if prepared.stream:
            response = StreamingHttpResponse(respond_stream(prepared), content_type="text/event-stream")
            response["Cache-Control"] = "no-cache"
            response["X-Accel-Buffering"] = "no"  # tell nginx-style proxies not to buffer tokens
            return response
        return JsonResponse(await respond_json(prepared))
    except ApiFailure as exc:
        return failure_response(exc)


@csrf_exempt
async def chat_completions(request):
    return await _generate(request, "chat")


@csrf_exempt
async def completions(request):
    return await _generate(request, "text")


@csrf_exempt
async def models(request):
    if request.method != "GET":
        return _method_not_allowed("GET")
    try:
        principal = await sync_to_async(inference_principal)(request, scope=INFERENCE)
    except KeyRejected as exc:
        return failure_response(ApiFailure(exc.status, exc.code, exc.message))
    data = await sync_to_async(models_for_tenant)(tenant=principal.tenant)
    return JsonResponse({"object": "list", "data": data})


async def prometheus_metrics(request):
    return HttpResponse(metrics.render(), content_type="text/plain; version=0.0.4; charset=utf-8")


@csrf_exempt
async def operator_endpoint(request, action: str):
    """vLLM-compatible adapter management for operators: staff session or LORAPLEX_OPERATOR_TOKEN."""
    try:
        await sync_to_async(operator.authorize)(request)
        if action == "lora_adapters":
            if request.method != "GET":
                return _method_not_allowed("GET")
            return JsonResponse({"object": "list", "data": await operator.list_adapters()})
        if request.method != "POST":
            return _method_not_allowed("POST")
        try:
            body = json.loads(request.body or b"{}")
        except json.JSONDecodeError:
            raise ApiFailure(400, "invalid_json", "The request body is not valid JSON.") from None
        return JsonResponse(await operator.perform(action, body))
    except ApiFailure as exc:
        return failure_response(exc)
