"""The OpenAI-compatible HTTP API: thin async views over the serving flows."""

import json

from asgiref.sync import sync_to_async
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse

from inference import ratelimit
from inference.auth import inference_principal_async
from inference.host.engine_host import HOST
from inference.http import json_endpoint, require_method
from inference.resolution import resolve_model
from tenants.scopes import INFERENCE

from .generation import Endpoint, prepare, respond_json, respond_stream
from .protocol import load_json
from .serving_chat import CHAT
from .serving_completion import COMPLETIONS
from .serving_models import model_for_tenant, models_for_tenant
from .serving_tokenize import (
    detokenize,
    parse_detokenize_request,
    parse_tokenize_request,
    tokenize,
)
from .tokenizing import tokenize_off_loop


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


async def _tokenizer_call(request, parse, answer):
    """/tokenize and /detokenize: the caller's key, its request rate, the model resolved in
    its tenant (for the tokenizer of that model's base), then the work off the event loop."""
    require_method(request, "POST")
    principal = await inference_principal_async(request, scope=INFERENCE)
    parsed = await sync_to_async(lambda: parse(load_json(request.body)), thread_sensitive=False)()
    await sync_to_async(ratelimit.check_request_rate)(principal=principal)
    engine = await HOST.started_engine()
    base = HOST.served_name()
    await sync_to_async(resolve_model)(
        tenant=principal.tenant, name=parsed.model or base, base_model_name=base
    )
    # One of the tenant's tokenization slots, in a worker thread (tokenizing.py).
    body = await tokenize_off_loop(principal.tenant.id, answer, engine.engine, parsed)
    content = await sync_to_async(json.dumps, thread_sensitive=False)(body)
    return HttpResponse(content, content_type="application/json")


@json_endpoint
async def tokenize_view(request):
    return await _tokenizer_call(request, parse_tokenize_request, tokenize)


@json_endpoint
async def detokenize_view(request):
    return await _tokenizer_call(request, parse_detokenize_request, detokenize)


@json_endpoint
async def models(request):
    require_method(request, "GET")
    principal = await inference_principal_async(request, scope=INFERENCE)
    data = await sync_to_async(models_for_tenant)(
        tenant=principal.tenant, contexts=_served_contexts()
    )
    return JsonResponse({"object": "list", "data": data})


@json_endpoint
async def model(request, model_id: str):
    require_method(request, "GET")
    principal = await inference_principal_async(request, scope=INFERENCE)
    found = await sync_to_async(model_for_tenant)(
        tenant=principal.tenant, model_id=model_id, contexts=_served_contexts()
    )
    return JsonResponse(found)


def _served_contexts() -> dict[str, int]:
    """This replica's base model and its context, once its engine runs (a control-plane
    replica has none, and listing models never starts one)."""
    engine = HOST.engine
    return {HOST.served_name(): engine.engine.max_seq_len} if engine is not None else {}
