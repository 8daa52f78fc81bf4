"""Each tenant tokenizes at most LORAPLEX_TENANT_MAX_TOKENIZATIONS texts at once in a process:
one more is a 429 `tokenizations_exceeded` at once (not a queue behind its own megabytes),
another tenant is unaffected, and a slot is held until the worker thread is done with the
text, even when the client that asked has gone. The work here is a function that waits on
an event, so "still tokenizing" is a state the test controls, not a race it hopes to win."""

import asyncio
import threading

import pytest

from inference.errors import TokenizationsExceeded
from inference.openai.tokenizing import TENANT_TOKENIZATIONS, tokenize_off_loop
from platform_site.error_responses import to_api_error

TENANT, OTHER = 9001, 9002


async def wait_until(condition) -> None:
    """Polls `condition` (a state another thread moves), with a generous bound."""
    for _ in range(2000):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the condition never held")


def test_one_more_than_the_cap_is_a_429_and_others_run(settings):
    settings.TENANT_MAX_TOKENIZATIONS = 2
    release = threading.Event()

    def tokenizing(text: str) -> int:
        release.wait(30)
        return len(text)

    async def scenario():
        running = [
            asyncio.create_task(tokenize_off_loop(TENANT, tokenizing, "ab")) for _ in range(2)
        ]
        await wait_until(lambda: TENANT_TOKENIZATIONS.running(TENANT) == 2)
        with pytest.raises(TokenizationsExceeded) as refused:
            await tokenize_off_loop(TENANT, tokenizing, "c")
        other = asyncio.create_task(tokenize_off_loop(OTHER, tokenizing, "xyz"))
        await wait_until(lambda: TENANT_TOKENIZATIONS.running(OTHER) == 1)
        release.set()
        return refused.value, await asyncio.gather(*running, other)

    error, results = asyncio.run(scenario())
    assert results == [2, 2, 3]
    answer = to_api_error(error)
    assert (answer.status, answer.code) == (429, "tokenizations_exceeded")
    assert answer.headers["Retry-After"] == "1"
    assert "LORAPLEX_TENANT_MAX_TOKENIZATIONS" in answer.message
    assert TENANT_TOKENIZATIONS.running(TENANT) == TENANT_TOKENIZATIONS.running(OTHER) == 0


def test_a_caller_gone_keeps_the_slot_until_the_thread_is_done(settings):
    settings.TENANT_MAX_TOKENIZATIONS = 1
    started, release = threading.Event(), threading.Event()

    def tokenizing() -> None:
        started.set()
        release.wait(30)
        raise ValueError("the text failed after its caller left")  # read, never logged

    async def scenario():
        caller = asyncio.create_task(tokenize_off_loop(TENANT, tokenizing))
        await wait_until(started.is_set)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        # the thread still works on the text: the tenant's one slot is still taken
        assert TENANT_TOKENIZATIONS.running(TENANT) == 1
        with pytest.raises(TokenizationsExceeded):
            await tokenize_off_loop(TENANT, lambda: None)
        release.set()
        await wait_until(lambda: TENANT_TOKENIZATIONS.running(TENANT) == 0)
        return await tokenize_off_loop(TENANT, lambda: "served")

    assert asyncio.run(scenario()) == "served"


def test_zero_turns_the_cap_off(settings):
    settings.TENANT_MAX_TOKENIZATIONS = 0
    release = threading.Event()

    async def scenario():
        tasks = [asyncio.create_task(tokenize_off_loop(TENANT, release.wait, 30)) for _ in range(8)]
        await wait_until(lambda: TENANT_TOKENIZATIONS.running(TENANT) == 8)
        release.set()
        return await asyncio.gather(*tasks)

    assert asyncio.run(scenario()) == [True] * 8
