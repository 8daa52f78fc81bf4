"""The ASGI application `manage.py serve` runs: Django behind the body limits, with a hook
for the end of each request (platform_site/request_end.py). API-key calls to /v1/ take a
handler without the browser's middleware (platform_site/api_key_calls.py)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "platform_site.settings")
django_application = get_asgi_application()

from platform_site.api_key_calls import ApiKeyCallHandler, is_api_key_call  # noqa: E402
from platform_site.body_limits import BodyLimits  # noqa: E402 (needs the settings loaded)
from platform_site.request_end import RequestEnd  # noqa: E402

api_key_application = ApiKeyCallHandler()


async def dispatch(scope, receive, send):
    app = api_key_application if is_api_key_call(scope) else django_application
    await app(scope, receive, send)


application = BodyLimits(RequestEnd(dispatch))
