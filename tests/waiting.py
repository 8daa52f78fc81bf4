"""Waiting for what another process or thread does: poll a condition, never sleep a guess.

A test that sleeps for what a quiet machine needs fails on a loaded one (a shared CI host
runs at a load of 4 to 7). Poll for the state the test needs instead; the timeout only
stops a hang, so it leaves room for a slow machine.
"""

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
HANG_GUARD_SECONDS = 120.0


def wait_for(
    check: Callable[[], T],
    *,
    what: str,
    timeout: float = HANG_GUARD_SECONDS,
    interval: float = 0.1,
) -> T:
    """Poll `check()` until it is truthy and return its value; AssertionError after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:g} s")
        time.sleep(interval)
