"""Usage metering off the request path: records queue in memory, a thread writes them in batches.

A request only appends to a queue; the writer thread flushes every second (or every
BATCH records) with one bulk insert, so metering never adds a database round trip to a
request's latency. `flush()` drains synchronously (shutdown, tests). When the database
is unreachable (a restart, a failover) the records wait in memory for the next flush,
up to MAX_BACKLOG of them.
"""

import logging
import queue
import threading

from django.db import InterfaceError, OperationalError, close_old_connections

from tenants.models import UsageRecord

logger = logging.getLogger(__name__)
BATCH = 200
INTERVAL_SECONDS = 1.0
MAX_BACKLOG = 100_000

_pending: queue.SimpleQueue = queue.SimpleQueue()
_backlog: list[UsageRecord] = []  # taken but not written yet (the database was down)
_writer: threading.Thread | None = None
_lock = threading.Lock()
_flush_lock = threading.Lock()


def record(**fields) -> None:
    """Queue one record; the writer thread (start_writer) or a flush() stores it."""
    _pending.put(UsageRecord(**fields))


def flush() -> int:
    """Write everything queued so far; returns how many records were written."""
    with _flush_lock:
        batch, _backlog[:] = list(_backlog), []
        while True:
            try:
                batch.append(_pending.get_nowait())
            except queue.Empty:
                break
        written = 0
        try:
            for i in range(0, len(batch), BATCH):
                UsageRecord.objects.bulk_create(batch[i : i + BATCH])
                written = min(i + BATCH, len(batch))
        except (OperationalError, InterfaceError) as exc:  # unreachable: try again later
            _keep(batch[written:], exc)
        except Exception:
            logger.exception(
                "could not write %d usage records; they are lost", len(batch) - written
            )
        return written


def _keep(unwritten: list[UsageRecord], exc: Exception) -> None:
    """Hold records the database refused for the next flush; the oldest go past MAX_BACKLOG."""
    dropped = max(0, len(unwritten) - MAX_BACKLOG)
    _backlog[:] = unwritten[dropped:]
    logger.warning(
        "could not write %d usage records (%s); keeping them for the next flush",
        len(unwritten),
        exc,
    )
    if dropped:
        logger.error("usage backlog full: %d oldest records are lost", dropped)


def start_writer():
    """Idempotent: the serving path calls it before recording."""
    global _writer
    with _lock:
        if _writer is None or not _writer.is_alive():
            _writer = threading.Thread(target=_run, name="loraplex-usage-writer", daemon=True)
            _writer.start()


def _run():
    stop = threading.Event()
    while not stop.wait(INTERVAL_SECONDS):
        close_old_connections()  # this thread's own connection: reopen after a database restart
        flush()
