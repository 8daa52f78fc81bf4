"""`manage.py serve`: the ASGI server (uvicorn) with this process's engine.

The engine starts before the first request is accepted, so /readyz is honest from the
first probe. On SIGTERM or Ctrl-C uvicorn stops accepting, lets in-flight streams finish
for up to LORAPLEX_DRAIN_SECONDS, and only then is the engine shut down.

If the engine's step loop fails, the engine is dead (its requests have already ended with
`engine_unavailable`): the server stops the same way and the command exits with status
ENGINE_FAILED_EXIT_CODE, so that its supervisor (compose's restart policy, systemd,
Kubernetes) starts a fresh process. uvicorn bounds the open connections
(LORAPLEX_MAX_CONNECTIONS, 503 beyond) and idle keep-alive time; request bodies are bounded
in front of Django (platform_site/body_limits.py).
"""

import logging
from functools import partial

import uvicorn
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from inference import usage
from inference.errors import EngineUnavailable
from inference.host.engine_host import HOST, host_engine_in_this_process
from inference.host.prefetch import start_prefetcher
from inference.host.startup_adapters import load_lora_modules, pin_configured_adapters

logger = logging.getLogger(__name__)

ENGINE_FAILED_EXIT_CODE = 70  # EX_SOFTWARE: an internal error, restart me


class Command(BaseCommand):
    help = (
        "Serve the control plane and the OpenAI-compatible API (with the engine unless "
        "LORAPLEX_ENGINE=off)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--log-level", default="info")

    def handle(self, host, port, log_level, **options):
        if settings.PRODUCTION:  # as `check --deploy`: weak secrets or DEBUG refuse to start
            self.check(include_deployment_checks=True)
        config = uvicorn.Config(
            "platform_site.asgi:application",
            host=host,
            port=port,
            log_level=log_level,
            lifespan="off",
            timeout_graceful_shutdown=settings.DRAIN_SECONDS,
            limit_concurrency=settings.MAX_CONNECTIONS or None,
            timeout_keep_alive=settings.KEEPALIVE_SECONDS,
        )
        server = uvicorn.Server(config)
        HOST.on_failure = partial(setattr, server, "should_exit", True)  # read by its loop
        if settings.ENGINE_ENABLED:
            try:
                host_engine_in_this_process()
                load_lora_modules(HOST)
            except EngineUnavailable as exc:
                raise CommandError(str(exc)) from None
            pin_configured_adapters(HOST)
            start_prefetcher(HOST.model.name)  # this replica's disk follows promotions
            self.stdout.write(f"Engine ready: {HOST.model.name} ({HOST.model.revision[:12]})")
        else:
            self.stdout.write("Engine off (LORAPLEX_ENGINE=off): control plane only.")
        try:
            server.run()
        finally:
            HOST.shutdown(timeout=settings.DRAIN_SECONDS)
            usage.flush()
        if HOST.failed:
            raise CommandError(
                f"{HOST.error}; exiting so that the supervisor starts a fresh process",
                returncode=ENGINE_FAILED_EXIT_CODE,
            )
