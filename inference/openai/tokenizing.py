"""Tokenizing a caller's text without letting it hold up the server: bounded in size before
the tokenizer sees it, run off the event loop with the GIL released, and a few at a time per
tenant.

A megabyte of text takes the tokenizer about a second. Encoding it in a worker thread was not
enough: `tokenizers`' single-text `encode` keeps the GIL for the whole call, so the event loop
(/healthz) and the engine's step thread (everyone's tokens) stood still behind it. The
engine's `Tokenizer.encode` goes through the batch path, which releases it.

The bound is a rule of characters, checked before tokenizing: a text longer than
`max_model_len` x `chars_per_token` characters is refused, where `chars_per_token` is
LORAPLEX_MAX_CHARS_PER_TOKEN or, if smaller, the most characters any token of the vocabulary
covers (past that the text cannot fit the context however it tokenizes). Prose runs about 4
characters a token, so the default of 8 refuses only texts that could not fit or would
average twice that.
"""

import asyncio
import os
import threading
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, TypeVar

from django.conf import settings

from inference.errors import ContextLengthExceeded, TokenizationsExceeded
from inference.metrics import TOKENIZATIONS_REFUSED, TOKENIZED_CHARACTERS

if TYPE_CHECKING:
    from inference.engine import LLMEngine

T = TypeVar("T")
# A long text encodes for tenths of a second of a core, outside the GIL: at most half the
# cores encode long texts at once, so the engine's step thread and the event loop keep the
# rest. Shorter texts (most prompts: milliseconds) never wait for them.
LONG_TEXT_CHARS = 16_384
_LONG_ENCODES = threading.BoundedSemaphore(max(1, (os.cpu_count() or 2) // 2))


def max_text_chars(llm: "LLMEngine") -> int:
    """The most characters of text this model's prompts, conversations and /tokenize take."""
    per_token = llm.tokenizer.max_token_chars
    if settings.MAX_CHARS_PER_TOKEN:
        per_token = min(per_token, settings.MAX_CHARS_PER_TOKEN)
    return llm.max_seq_len * max(per_token, 1)


def refuse_long_text(llm: "LLMEngine", chars: int, *, where: str, param: str) -> None:
    """`where` (say "The prompt") of `chars` characters, refused if over the bound."""
    limit = max_text_chars(llm)
    if chars > limit:
        TOKENIZATIONS_REFUSED.labels(reason="too_long").inc()
        raise ContextLengthExceeded(
            f"{where} is {chars} characters; this model takes at most {limit} "
            f"({llm.max_seq_len} tokens of context x {limit // llm.max_seq_len} characters "
            "per token, LORAPLEX_MAX_CHARS_PER_TOKEN), refused before tokenizing.",
            param=param,
        )


def encode_text(
    llm: "LLMEngine",
    text: str,
    *,
    add_special_tokens: bool = True,
    where: str = "The prompt",
    param: str = "prompt",
) -> list[int]:
    """The token ids of a caller's text (a prompt, a rendered conversation), within the
    bound; every text the serving layer tokenizes passes here."""
    refuse_long_text(llm, len(text), where=where, param=param)
    TOKENIZED_CHARACTERS.inc(len(text))
    if len(text) < LONG_TEXT_CHARS:
        return llm.tokenizer.encode(text, add_special_tokens=add_special_tokens)
    with _LONG_ENCODES:
        return llm.tokenizer.encode(text, add_special_tokens=add_special_tokens)


def messages_chars(messages: list[dict]) -> int:
    """The characters of a conversation's texts, before its template adds its own: a cheap
    first bound (the rendered text is checked again, with tool calls and all)."""
    return sum(len(m.get("content") or "") for m in messages)


class TenantTokenizations:
    """Each tenant's tokenizations running in this process, at most
    LORAPLEX_TENANT_MAX_TOKENIZATIONS at once: more is a 429 at once, not a queue, so one
    tenant's megabytes never stand in front of another's prompts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[int, int] = defaultdict(int)

    def acquire(self, tenant_id: int) -> None:
        cap = settings.TENANT_MAX_TOKENIZATIONS
        with self._lock:
            if cap and self._running[tenant_id] >= cap:
                TOKENIZATIONS_REFUSED.labels(reason="concurrency").inc()
                raise TokenizationsExceeded(
                    f"Too many concurrent tokenizations: at most {cap} at once per tenant "
                    "(prompts being tokenized, /tokenize, /detokenize; "
                    "LORAPLEX_TENANT_MAX_TOKENIZATIONS).",
                    retry_after=1,
                )
            self._running[tenant_id] += 1

    def release(self, tenant_id: int) -> None:
        with self._lock:
            self._running[tenant_id] -= 1
            if not self._running[tenant_id]:
                del self._running[tenant_id]

    def running(self, tenant_id: int) -> int:
        with self._lock:
            return self._running.get(tenant_id, 0)


TENANT_TOKENIZATIONS = TenantTokenizations()
# Tokenizing has threads of its own: texts of many tenants at once would otherwise take every
# thread of the event loop's default pool, where every request's body is parsed. Mostly
# outside the GIL, they share the cores as the OS schedules them, so a short prompt is not
# queued behind long ones.
_TOKENIZING_THREADS = ThreadPoolExecutor(max_workers=32, thread_name_prefix="tokenize")


async def tokenize_off_loop(tenant_id: int, work: Callable[..., T], *args) -> T:
    """`work(*args)` (rendering, tokenizing) in a worker thread, holding one of the tenant's
    tokenization slots until the thread is done with it: a client that hangs up does not
    free its slot while its text is still being tokenized."""
    TENANT_TOKENIZATIONS.acquire(tenant_id)
    try:
        running = asyncio.get_running_loop().run_in_executor(
            _TOKENIZING_THREADS, partial(work, *args)
        )
    except BaseException:
        TENANT_TOKENIZATIONS.release(tenant_id)
        raise

    def done(future: asyncio.Future) -> None:
        TENANT_TOKENIZATIONS.release(tenant_id)
        if not future.cancelled():
            future.exception()  # read: a caller gone before it ended logs no stray error

    running.add_done_callback(done)
    return await asyncio.shield(running)
