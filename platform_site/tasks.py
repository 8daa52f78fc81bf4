"""Tasks that belong to the platform itself rather than to one app."""

import socket

from celery import shared_task


@shared_task(name="platform.ping")
def ping() -> dict:
    """A round trip through the broker: proves a worker is consuming, names which one."""
    return {"pong": True, "host": socket.gethostname()}
