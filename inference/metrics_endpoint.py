"""GET /metrics: the Prometheus scrape, behind the metrics token when one is set."""

from asgiref.sync import sync_to_async
from django.http import HttpResponse

from . import metrics
from .auth import authorize_scrape
from .http import json_endpoint, require_method


@json_endpoint
async def prometheus_metrics(request):
    require_method(request, "GET")
    authorize_scrape(request)
    body = await sync_to_async(metrics.render)()  # some collectors read the database
    return HttpResponse(body, content_type="text/plain; version=0.0.4; charset=utf-8")
