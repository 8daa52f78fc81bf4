"""One engine per process, shared by every request: the bridge between Django and the engine.

`serve` starts it before taking traffic (so /readyz tells the truth), then loads the
start-up adapters (startup_adapters.py); a control-plane-only replica runs with
LORAPLEX_ENGINE=off and never loads a model. Adapters reach the engine
as LoRARequests naming a staged folder; on a cache miss the engine calls `_fetch_adapter`
(off its step thread), which stages the version from object storage once.

If the engine's step loop fails, the engine is dead (inference/engine/async_engine.py): its
requests end with `engine_unavailable`, /readyz turns 503, and `on_failure` (set by `serve`)
stops the server so that the process exits for its supervisor to restart.
"""

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from asgiref.sync import sync_to_async
from django.conf import settings

from inference.errors import EngineUnavailable
from platform_site.health import READINESS_CHECKS, READINESS_NOTES
from registry.selectors import (
    base_model_default,
    base_model_find,
    base_model_names,
    version_find_by_uid,
)
from registry.staging import ensure_staged

if TYPE_CHECKING:
    from inference.engine import AsyncLLMEngine

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServedModel:
    name: str
    revision: str
    path: Path


class EngineHost:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.engine: AsyncLLMEngine | None = None
        self.model: ServedModel | None = None
        self.error: str | None = None
        self.failed = False  # the step loop died: only a new process serves again
        self.on_failure: Callable[[], None] | None = None

    @property
    def started(self) -> bool:
        return self.engine is not None

    def get(self):
        """The running engine, starting it on first use."""
        if self.engine is None:
            self.start()
        return self.engine

    async def started_engine(self) -> "AsyncLLMEngine":
        """For async views: the running engine, started (in a worker thread) on first use."""
        return self.engine or await sync_to_async(self.start, thread_sensitive=False)()

    def served_name(self) -> str:
        """The base model this process serves; callers start the engine first."""
        assert self.model is not None, "set together with the engine"
        return self.model.name

    def start(self):
        with self._lock:
            if self.engine is not None:
                return self.engine
            if not settings.ENGINE_ENABLED:
                raise EngineUnavailable(
                    "This replica serves the control plane only (LORAPLEX_ENGINE=off)."
                )
            try:
                engine, self.model = _build_engine(on_failure=self._engine_failed)
                self.engine = engine  # after the model: a started engine's name is known
                self.error = None
            except EngineUnavailable as exc:
                self.error = str(exc)
                raise
            except Exception as exc:  # a broken model folder must not look like a healthy replica
                logger.exception("the engine failed to start")
                self.error = f"{type(exc).__name__}: {exc}"
                raise EngineUnavailable(f"The engine failed to start: {self.error}") from exc
            return self.engine

    def _engine_failed(self, error: BaseException) -> None:
        """On the step thread, once: the engine refuses everything from now on."""
        self.failed = True
        self.error = f"the engine's step loop failed ({type(error).__name__})"
        if self.on_failure is not None:
            self.on_failure()

    def stats(self) -> dict | None:
        return self.engine.stats() if self.engine is not None else None

    def shutdown(self, timeout: float = 30.0):
        with self._lock:
            engine, self.engine = self.engine, None
        if engine is not None:
            engine.shutdown(timeout)


def _build_engine(on_failure: Callable[[BaseException], None]):
    from inference.engine import AsyncLLMEngine, EngineConfig, LLMEngine

    base = _base_model_to_serve()
    config = EngineConfig(model=base.local_path, **settings.ENGINE_OPTIONS)
    engine = AsyncLLMEngine(LLMEngine(config, lora_loader=_fetch_adapter), on_failure=on_failure)
    logger.info("engine started: %s (%s) on %s", base.name, base.revision[:12], config.device)
    if config.emulate_device is not None:
        line = emulated_device_note(config)
        logger.warning("%s", line.upper())
        READINESS_NOTES["device"] = lambda: line
    return engine, ServedModel(name=base.name, revision=base.revision, path=Path(base.local_path))


def emulated_device_note(config) -> str:
    quantization = f" {config.emulate_quantization}" if config.emulate_quantization else ""
    return (
        f"the device is emulated: {config.emulate_model}{quantization} on "
        f"{config.emulate_device} x{config.tensor_parallel_size}; no model runs, every answer "
        f"is made-up tokens, each step takes the cost model's time"
    )


def _base_model_to_serve():
    """LORAPLEX_BASE_MODEL's base model, else the default one: this replica's, one of any
    number that replicas serve side by side."""
    name = settings.BASE_MODEL_NAME
    base = base_model_find(name=name) if name else base_model_default()
    if base is not None:
        return base
    if not name:
        raise EngineUnavailable(
            "No base model is imported: run "
            "`manage.py import_base_model --preset smollm2-135m-instruct`."
        )
    known = ", ".join(base_model_names()) or "none"
    raise EngineUnavailable(
        f"LORAPLEX_BASE_MODEL is {name!r}, which is not an imported base model (known: {known})."
    )


def _fetch_adapter(lora_request) -> Path:
    """The engine's loader callback: stage a version that is not on local disk yet. When the
    engine names a folder it could not load, that copy's bytes are checked in full and, if
    damaged, staged again from object storage (this request waits for it)."""
    from django.db import close_old_connections

    close_old_connections()  # runs on an engine loader thread, outside any request
    try:
        version = version_find_by_uid(uid=lora_request.adapter_id)
        if version is None:
            raise LookupError(f"no adapter version has uid {lora_request.adapter_id}")
        failed = lora_request.path is not None and os.path.isdir(lora_request.path)
        return ensure_staged(version, suspect=failed)
    finally:
        close_old_connections()


HOST = EngineHost()


def check_engine() -> None:
    if HOST.engine is None:
        raise EngineUnavailable(HOST.error or "the engine has not started")
    if not HOST.engine.is_alive():
        raise EngineUnavailable(HOST.error if HOST.failed else "the engine's step loop has stopped")


def host_engine_in_this_process():
    """Called by `serve` when this process hosts the engine: /readyz now includes it."""
    READINESS_CHECKS["engine"] = check_engine
    return HOST.start()
