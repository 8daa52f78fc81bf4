"""LORAPLEX_PINNED_ADAPTERS: popular adapters loaded and pinned at start-up (vLLM's --lora-modules)."""

import asyncio
import logging

from platform_site.errors import ApiError

from .operator import resolve_operator_name

logger = logging.getLogger(__name__)


def pin_configured_adapters(host) -> list[str]:
    """Load and pin each `tenant/adapter[@alias|:n]`; one that fails is logged, not fatal."""
    from django.conf import settings

    pinned = []
    for name in settings.PINNED_ADAPTERS:
        try:
            lora = resolve_operator_name(name)
            asyncio.run(host.engine.load_lora(lora, pin=True))
        except (ApiError, ValueError) as exc:  # ValueError: the engine's EngineError
            logger.error("could not pin %s: %s", name, getattr(exc, "message", exc))
            continue
        pinned.append(name)
        logger.info("pinned %s", name)
    return pinned
