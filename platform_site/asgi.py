"""The ASGI application `manage.py serve` runs: Django behind the body limits, with a hook
for the end of each request (platform_site/request_end.py)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "platform_site.settings")
django_application = get_asgi_application()

from platform_site.body_limits import BodyLimits  # noqa: E402 (needs the settings loaded)
from platform_site.request_end import RequestEnd  # noqa: E402

application = BodyLimits(RequestEnd(django_application))
