"""Each engine replica's background sync of its local adapter cache.

A daemon thread listens on the Redis channel the registry announces servable versions on
(registry/announcements.py) and stages a version of this replica's base model into this
replica's own cache folder (registry/staging.py: downloaded, sha256 checked, renamed into
place whole), so the engine's loader finds it on disk and never waits for the network on the
first request after a promotion.

Only what routing sends here: the router hashes each request by caller and adapter
(docker/haproxy.cfg), which a replica cannot recompute, so it stages a version only of an
adapter its engine has served since it started (any of the adapter's versions is known to
the engine); the affinity that sent it the old version sends it the new one. Copies staged
ahead of a request are marked and kept within LORAPLEX_PREFETCH_BYTES; beyond it, and
before the cache's own LRU touches a served copy, the oldest never-served ones go first.

At start, and after every reconnection (messages sent while it was away are lost), it does
the same for the versions an alias points at. Failures are logged and retried with backoff;
the engine still stages on a miss, so nothing here is on a request's path.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import redis
from django.conf import settings
from django.db import close_old_connections

from registry.announcements import BASE_MODEL, CHANNEL, VERSION
from registry.model_names import version_name
from registry.selectors import aliased_ready_version_uids, version_find_by_uid
from registry.staging import ensure_staged, evict_prefetched, is_staged, mark_prefetched

from .engine_host import HOST

logger = logging.getLogger(__name__)
RETRY_SECONDS = (1, 2, 5, 10, 30)


@dataclass(frozen=True)
class Served:
    """What this replica's engine has served: `tenant/adapter` names, and version uids."""

    adapters: frozenset[str] = frozenset()
    versions: frozenset[str] = frozenset()


def adapter_of(name: str) -> str:
    """`tenant/adapter:n` (a version's name in the engine) -> `tenant/adapter`."""
    return name.rpartition(":")[0] or name


def engine_served() -> Served:
    """The adapters this process's engine knows: loaded since start, in any tier (its entries
    stay when their host copy is evicted), unless an operator unloaded them."""
    engine = HOST.engine
    if engine is None:
        return Served()
    loras = asyncio.run(engine.list_loras())  # a read under the LoRA manager's lock
    return Served(
        adapters=frozenset(adapter_of(lora["name"]) for lora in loras),
        versions=frozenset(uuid.UUID(lora["adapter_id"]).hex for lora in loras),
    )


class Prefetcher:
    def __init__(
        self,
        base_model: str,
        *,
        served: Callable[[], Served] = engine_served,
        budget: int | None = None,
    ):
        self.base_model = base_model
        self.served = served
        self.budget = settings.PREFETCH_BYTES if budget is None else budget
        self.stop = threading.Event()
        self.subscribed = threading.Event()  # set while listening (tests wait on it)
        self.staged = 0
        self.skipped = 0
        self.thread = threading.Thread(target=self._run, name="loraplex-prefetch", daemon=True)

    def start(self) -> Prefetcher:
        self.thread.start()
        return self

    def _run(self) -> None:
        failures = 0
        while not self.stop.is_set():
            pubsub = None
            try:
                client = redis.Redis.from_url(settings.REDIS_URL, health_check_interval=30)
                pubsub = client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(CHANNEL)
                self.subscribed.set()
                failures = 0
                self._stage_aliased()
                while not self.stop.is_set():
                    message = pubsub.get_message(timeout=1.0)
                    if message is not None:
                        self._on_message(message["data"])
            except redis.RedisError as exc:
                self.subscribed.clear()
                wait = RETRY_SECONDS[min(failures, len(RETRY_SECONDS) - 1)]
                failures += 1
                logger.warning(
                    "adapter prefetch: Redis unavailable (%s); retrying in %s s", exc, wait
                )
                self.stop.wait(wait)
            finally:
                if pubsub is not None:
                    pubsub.close()

    def _on_message(self, data: bytes | str) -> None:
        try:
            message = json.loads(data)
            uid, base = message[VERSION], message[BASE_MODEL]
        except (ValueError, KeyError, TypeError):
            logger.warning("adapter prefetch: ignoring a malformed message %r", data[:200])
            return
        if base == self.base_model:
            self.prefetch(uid=uid)

    def _stage_aliased(self) -> None:
        """Versions some alias points at, of this base: what traffic is about to ask for."""
        uids = self._with_db(lambda: aliased_ready_version_uids(base_model_name=self.base_model))
        for uid in uids or []:
            self.prefetch(uid=uid)

    def prefetch(self, *, uid: str) -> bool:
        """Stage version `uid` if this replica served its adapter, within the budget; whether
        it was staged now."""
        if self._with_db(lambda: self._stage_if_served(uid)):
            self.staged += 1
            logger.info("adapter prefetch: %s is on local disk", uid)
            return True
        return False

    def _stage_if_served(self, uid: str) -> bool:
        version = version_find_by_uid(uid=uid)
        if version is None or version.status != version.READY or is_staged(version):
            return False
        served = self.served()
        if adapter_of(version_name(version)) not in served.adapters:
            self.skipped += 1
            logger.info("adapter prefetch: not staging %s: its adapter is not served here", uid)
            return False
        size = version.config_size + version.weights_size
        if size > self.budget:
            logger.info(
                "adapter prefetch: not staging %s: %d bytes, over LORAPLEX_PREFETCH_BYTES",
                uid,
                size,
            )
            return False
        for evicted in evict_prefetched(served=served.versions, room=size, budget=self.budget):
            logger.info("adapter prefetch: evicted %s, prefetched and never served", evicted)
        mark_prefetched(version)  # before the folder exists: no unmarked prefetched copy
        ensure_staged(version)
        return True

    @staticmethod
    def _with_db(work):
        """Run `work` with fresh database connections; log and skip what fails (the engine
        stages on a miss)."""
        close_old_connections()
        try:
            return work()
        except Exception:
            logger.exception("adapter prefetch failed")
            return None
        finally:
            close_old_connections()


def start_prefetcher(base_model: str) -> Prefetcher | None:
    """Called by `serve` once its engine runs; none without Redis (REDIS_URL) or budget."""
    if not settings.REDIS_URL or settings.PREFETCH_BYTES <= 0:
        logger.info("adapter prefetch off: adapters are staged on their first request")
        return None
    return Prefetcher(base_model).start()
