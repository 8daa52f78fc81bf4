"""Each engine replica's background sync of its local adapter cache.

A daemon thread listens on the Redis channel the registry announces servable versions on
(registry/announcements.py) and stages each version of this replica's base model into
this replica's own cache folder (registry/staging.py: downloaded, sha256 checked, renamed
into place whole), so the engine's loader finds it on disk and never waits for the network
on the first request. At start, and after every reconnection (messages sent while it was
away are lost), it stages the versions an alias points at. Failures are logged and retried
with backoff; the engine still stages on a miss, so nothing here is on a request's path.
"""

from __future__ import annotations

import json
import logging
import threading

import redis
from django.conf import settings
from django.db import close_old_connections

from registry.announcements import BASE_MODEL, CHANNEL, VERSION
from registry.selectors import aliased_ready_version_uids, version_find_by_uid
from registry.staging import ensure_staged

logger = logging.getLogger(__name__)
RETRY_SECONDS = (1, 2, 5, 10, 30)


class Prefetcher:
    def __init__(self, base_model: str):
        self.base_model = base_model
        self.stop = threading.Event()
        self.subscribed = threading.Event()  # set while listening (tests wait on it)
        self.staged = 0
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
            self._stage(uid=uid)

    def _stage_aliased(self) -> None:
        """Versions some alias points at, of this base: what traffic is about to ask for."""
        uids = self._with_db(lambda: aliased_ready_version_uids(base_model_name=self.base_model))
        for uid in uids or []:
            self._stage(uid=uid)

    def _stage(self, *, uid: str) -> None:
        def stage():
            version = version_find_by_uid(uid=uid)
            if version is None or version.status != version.READY:
                return None
            return ensure_staged(version)

        folder = self._with_db(stage)
        if folder is not None:
            self.staged += 1
            logger.info("adapter prefetch: %s is on local disk", uid)

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
    """Called by `serve` once its engine runs; none without Redis (REDIS_URL)."""
    if not settings.REDIS_URL:
        logger.info("adapter prefetch off: adapters are staged on their first request")
        return None
    return Prefetcher(base_model).start()
