"""What every async view of the serving layer shares: errors answered as JSON, methods
checked."""

from functools import wraps

from django.views.decorators.csrf import csrf_exempt

from platform_site.error_responses import json_error_response
from platform_site.errors import MethodNotAllowed

from .metrics import HTTP_REQUESTS


def json_endpoint(view):
    """CSRF-exempt (API clients send no cookies; auth.py checks sessions itself), and any
    exception becomes its JSON answer, counted as refused."""

    @csrf_exempt
    @wraps(view)
    async def answer(request, *args, **kwargs):
        try:
            return await view(request, *args, **kwargs)
        except Exception as exc:
            response = json_error_response(exc)
            HTTP_REQUESTS.labels(endpoint="refused", status=str(response.status_code)).inc()
            return response

    return answer


def require_method(request, method: str) -> None:
    if request.method != method:
        raise MethodNotAllowed(f"Use {method}.", headers={"Allow": method})
