"""Unexpected exceptions in background work: logged once, with an id that the version quotes.

A bug (or a file that reaches one) must end a version with a reason a person can read, not
leave it `validating` for the sweep; the traceback stays in the log, under the same id.
"""

import logging
import uuid

log = logging.getLogger("registry.tasks")


def log_unexpected(exc: BaseException, *, what: str) -> str:
    """Log `exc` with its traceback under a new error id, and return the id."""
    error_id = uuid.uuid4().hex
    log.error("%s failed unexpectedly (error id %s)", what, error_id, exc_info=exc)
    return error_id
