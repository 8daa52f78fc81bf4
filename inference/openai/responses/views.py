"""The Responses API's thin async views: create, and read or delete a stored response."""

import json

from asgiref.sync import sync_to_async
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse

from inference.auth import inference_principal_async
from inference.http import json_endpoint, require_method
from platform_site.errors import MethodNotAllowed

from .serving import prepare_response, respond_json, respond_stream
from .store import stored_response_body, stored_response_delete


@json_endpoint
async def responses(request):
    require_method(request, "POST")
    prepared, answer = await prepare_response(request)
    if prepared.stream:
        response = StreamingHttpResponse(
            respond_stream(prepared, answer), content_type="text/event-stream"
        )
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # tell nginx-style proxies not to buffer tokens
        return response
    body = await respond_json(prepared, answer)
    content = await sync_to_async(json.dumps, thread_sensitive=False)(body)
    return HttpResponse(content, content_type="application/json")


@json_endpoint
async def response(request, response_id: str):
    """GET: the stored response; DELETE: it is gone. Only the tenant's own."""
    if request.method not in ("GET", "DELETE"):
        raise MethodNotAllowed("Use GET or DELETE.", headers={"Allow": "GET, DELETE"})
    principal = await inference_principal_async(request)
    if request.method == "GET":
        body = await sync_to_async(stored_response_body)(
            tenant=principal.tenant, response_id=response_id
        )
        return JsonResponse(body)
    await sync_to_async(stored_response_delete)(tenant=principal.tenant, response_id=response_id)
    return JsonResponse({"id": response_id, "object": "response", "deleted": True})
