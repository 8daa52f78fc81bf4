"""`manage.py serve`: the ASGI server (uvicorn) with this process's engine.

The engine starts before the first request is accepted, so /readyz is honest from the
first probe. On SIGTERM or Ctrl-C uvicorn stops accepting, lets in-flight streams finish
for up to LORAPLEX_DRAIN_SECONDS, and only then is the engine shut down.
"""

import logging

import uvicorn
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from inference import usage
from inference.engine_host import HOST, EngineUnavailable, host_engine_in_this_process
from inference.pinning import pin_configured_adapters

logger = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Serve the control plane and the OpenAI-compatible API (with the engine unless LORAPLEX_ENGINE=off)."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--log-level", default="info")

    def handle(self, host, port, log_level, **options):
        if settings.ENGINE_ENABLED:
            try:
                host_engine_in_this_process()
            except EngineUnavailable as exc:
                raise CommandError(str(exc)) from None
            pin_configured_adapters(HOST)
            self.stdout.write(f"Engine ready: {HOST.model.name} ({HOST.model.revision[:12]})")
        else:
            self.stdout.write("Engine off (LORAPLEX_ENGINE=off): control plane only.")
        config = uvicorn.Config(
            "platform_site.asgi:application",
            host=host,
            port=port,
            log_level=log_level,
            lifespan="off",
            timeout_graceful_shutdown=settings.DRAIN_SECONDS,
        )
        try:
            uvicorn.Server(config).run()
        finally:
            HOST.shutdown(timeout=settings.DRAIN_SECONDS)
            usage.flush()
