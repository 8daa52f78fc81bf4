"""Telling the engine replicas that a version is worth having on local disk.

When a version becomes ready or an alias moves to one, a message goes out on a Redis
channel after the transaction commits; each engine replica that serves the version's base
model stages it into its own adapter cache in the background, so the first request after a
promotion is served from local disk. Nobody polls object storage. A message lost (Redis
down, a replica restarting) costs only that first request its disk hit: the engine stages
on a miss anyway.
"""

from __future__ import annotations

import json
import logging

from django.conf import settings
from django.db import transaction

log = logging.getLogger(__name__)
CHANNEL = "loraplex:versions:servable"
VERSION = "version"  # the version's uid, hex
BASE_MODEL = "base_model"  # its base model's name: replicas of other bases ignore it


def announce_on_commit(version) -> None:
    """Publish `version` (ready, or an alias's new target) once the transaction commits."""
    message = json.dumps({VERSION: version.uid.hex, BASE_MODEL: version.adapter.base_model.name})
    transaction.on_commit(lambda: publish(message))


def publish(message: str) -> int:
    """Send one message; the number of replicas that heard it (0 without Redis)."""
    if not settings.REDIS_URL:
        return 0
    import redis

    try:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2)
        try:
            return int(client.publish(CHANNEL, message))
        finally:
            client.close()
    except redis.RedisError as exc:  # the engines stage on a miss: never fail the change
        log.warning("could not announce a servable version to the replicas: %s", exc)
        return 0
