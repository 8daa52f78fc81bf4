"""The adapters an engine loads and pins at start-up, before it takes traffic: vLLM's
`--lora-modules name=path ...` (LORAPLEX_LORA_MODULES) and registered versions by name
(LORAPLEX_PINNED_ADAPTERS).

Each LORAPLEX_LORA_MODULES entry `<tenant>/<adapter>=<folder or s3://bucket/prefix/>` is
what a `load_lora_adapter` call with `load_inplace: true` does: the files are registered as the
adapter's next version (the same files again are the same version, so a restart registers
nothing new), validated, and once servable loaded and pinned, before the server takes
traffic. A version whose quality gate is still evaluating (the worker scores it on the
engines, so not before this one listens) is loaded and pinned by a background thread once it
passes. Whoever starts the process wrote the paths, so local folders are not held to
LORAPLEX_LORA_PATH_ROOTS.

A malformed entry stops the start (a typo in the configuration); files that cannot be
registered or served are logged and skipped, as pinned names that do not resolve are, so that
one adapter cannot keep the whole replica down.
"""

import asyncio
import logging
import threading

from django.conf import settings
from django.db import close_old_connections

from inference.errors import EngineUnavailable, ModelNotServable, ProtocolError
from platform_site.errors import ApiError
from registry.model_names import version_name

from .lora_loading import (
    OperatorCall,
    adapter_target,
    await_servable,
    load_version,
    register,
    resolve_operator_name,
    source_of,
)

logger = logging.getLogger(__name__)
ACTOR = "operator:LORAPLEX_LORA_MODULES"  # who the audit trail says registered them


def configured_modules() -> list[OperatorCall]:
    """The setting's entries as in-place loads; EngineUnavailable names a malformed one."""
    calls = []
    for entry in settings.LORA_MODULES:
        name, sep, path = entry.partition("=")
        if not sep or not path:
            raise EngineUnavailable(
                f"LORAPLEX_LORA_MODULES entry {entry!r} is not "
                "<tenant>/<adapter>=<folder or s3://bucket/prefix/>"
            )
        try:
            adapter_target(name)
        except ProtocolError as exc:
            raise EngineUnavailable(
                f"LORAPLEX_LORA_MODULES entry {entry!r}: {exc.message}"
            ) from None
        calls.append(OperatorCall(name, path, load_inplace=True))
    return calls


def load_lora_modules(host) -> list[str]:
    """Register, load and pin each module; returns the versions loaded before serving."""
    loaded = [_load_module(host, call) for call in configured_modules()]
    return [name for name in loaded if name is not None]


def _load_module(host, call: OperatorCall) -> str | None:
    assert call.lora_path is not None
    try:
        source = source_of(call.lora_path, fenced=False)
        registered = register(adapter_target(call.lora_name), source, actor=ACTOR, replace=True)
        version = registered.version
        try:
            lora = await_servable(version, timeout=0)
        except ModelNotServable as exc:
            logger.warning("LORAPLEX_LORA_MODULES: %s; loading it once it is", exc.message)
            threading.Thread(
                target=_load_when_servable,
                args=(host, version),
                name=f"lora-module-{version_name(version)}",
                daemon=True,
            ).start()
            return None
        asyncio.run(load_version(host.engine, lora))
    except (ApiError, ValueError) as exc:  # ValueError: the engine's EngineError
        logger.error(
            "LORAPLEX_LORA_MODULES: %s not loaded: %s", call.lora_name, getattr(exc, "message", exc)
        )
        return None
    logger.info("LORAPLEX_LORA_MODULES: loaded and pinned %s", lora.name)
    return lora.name


def _load_when_servable(host, version) -> None:
    """Off the start-up path: wait for the quality gate's verdict, then load and pin."""
    try:
        lora = await_servable(version, timeout=settings.LORA_LOAD_WAIT_SECONDS)
        asyncio.run(load_version(host.engine, lora))
    except Exception as exc:  # a thread of its own: nobody else would hear of it
        message = getattr(exc, "message", exc)
        logger.error("LORAPLEX_LORA_MODULES: %s not loaded: %s", version_name(version), message)
    else:
        logger.info("LORAPLEX_LORA_MODULES: loaded and pinned %s", lora.name)
    finally:
        close_old_connections()


def pin_configured_adapters(host) -> list[str]:
    """Load and pin each `tenant/adapter[@alias|:n]`; one that fails is logged, not fatal."""
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
