"""The quality gate's scoring: how well an adapter version, and the base model alone,
predict an eval set's completions (POST /v1/internal/score, described in the OpenAPI
schema). The Celery worker that evaluates versions calls it through registry/engines.py.

A row's prompt is what the OpenAI-compatible API would run, so a score measures what tenants
get. A chat row's completion ends where the template ends the assistant's turn (ChatML's
`<|im_end|>` is scored too), so an adapter that says the right words but does not stop scores
worse than one that stops. Versions are looked up by uid, not through tenants' model names:
a version awaiting its evaluation is not servable to tenants, yet must be scored. Rows run at
background priority, a few at a time, so tenants' traffic goes first.
"""

from __future__ import annotations

import asyncio
import math
import sys
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from asgiref.sync import sync_to_async
from django.conf import settings

from inference.engine import Priority, TokenizerError
from inference.errors import (
    ContextLengthExceeded,
    ModelNotFound,
    ModelNotServable,
    ProtocolError,
    UnknownParameter,
)
from inference.host.engine_host import HOST, ServedModel
from inference.openai.logprob_entries import MIN_LOGPROB
from inference.openai.protocol import load_json, parse_chat_messages
from inference.openai.serving_chat import chat_prompt_ids
from inference.openai.serving_completion import text_prompt_ids
from inference.resolution import lora_request_for
from platform_site.operator_protocol import ADAPTER_VERSION, ROWS
from registry.selectors import version_find_by_uid

if TYPE_CHECKING:
    from inference.engine import AsyncLLMEngine, LLMEngine, LoRARequest
    from registry.models import AdapterVersion

DEFAULT_MAX_ROWS = 200  # settings.EVAL_MAX_ROWS, where set, bounds the rows of one request
CONCURRENCY = 8  # rows in the engine at once, two requests each (adapter and base)
BODY_FIELDS = {ADAPTER_VERSION, ROWS}
ROW_FIELDS = {"messages", "prompt", "completion"}
# Rendered as an assistant's text, to find what the chat template writes after a reply.
_TURN_MARK = "\u2063loraplex-completion\u2063"

T = TypeVar("T")


@dataclass(frozen=True)
class Row:
    """One eval row as sent: `messages` (a chat prompt) or `prompt` (text), and `completion`."""

    completion: str
    messages: list[dict] | None = None
    prompt: str | None = None

    @property
    def chars(self) -> int:
        texts = [m["content"] for m in self.messages] if self.messages else [self.prompt or ""]
        return sum(len(t) for t in texts) + len(self.completion)


@dataclass(frozen=True)
class ScoreBody:
    version_uid: uuid.UUID | None
    rows: list[Row]


@dataclass(frozen=True)
class TokenizedRow:
    prompt_ids: list[int]
    completion_ids: list[int]  # with the chat template's end-of-turn token, where it has one


@dataclass(frozen=True)
class RowScore:
    tokens: int
    adapter_nll: float | None  # None: no adapter was scored
    base_nll: float


# ---------------------------------------------------------------- the body


def max_rows() -> int:
    return int(getattr(settings, "EVAL_MAX_ROWS", DEFAULT_MAX_ROWS))


def parse_score_body(body: dict, *, limit: int) -> ScoreBody:
    """The request body, checked strictly: every refusal is a ProtocolError naming its field."""
    for name in body:
        if name not in BODY_FIELDS:
            raise UnknownParameter(
                f"Unknown field '{name}'; the body holds {ADAPTER_VERSION} and {ROWS}.", param=name
            )
    return ScoreBody(_parse_uid(body), _parse_rows(body.get(ROWS), limit))


def _parse_uid(body: dict) -> uuid.UUID | None:
    if ADAPTER_VERSION not in body:
        raise ProtocolError(
            f"{ADAPTER_VERSION} is required: a version's uid, or null for the base model alone.",
            param=ADAPTER_VERSION,
        )
    value = body[ADAPTER_VERSION]
    if value is None:
        return None
    try:
        if not isinstance(value, str):
            raise ValueError
        return uuid.UUID(value)
    except ValueError:
        raise ProtocolError(
            f"{ADAPTER_VERSION} must be a version's uid (a UUID string) or null; got {value!r}.",
            param=ADAPTER_VERSION,
        ) from None


def _parse_rows(rows, limit: int) -> list[Row]:
    if not isinstance(rows, list) or not rows:
        raise ProtocolError(f"{ROWS} must be a non-empty list of rows.", param=ROWS)
    if len(rows) > limit:
        raise ProtocolError(
            f"{ROWS} holds {len(rows)} rows; one request scores at most {limit}.", param=ROWS
        )
    return [_parse_row(row, f"{ROWS}[{i}]") for i, row in enumerate(rows)]


def _parse_row(row, where: str) -> Row:
    if not isinstance(row, dict):
        raise ProtocolError(f"{where} must be an object.", param=where)
    for name in row:
        if name not in ROW_FIELDS:
            raise UnknownParameter(
                f"{where} has an unknown field '{name}'; a row holds messages or prompt, and "
                "completion.",
                param=f"{where}.{name}",
            )
    if ("messages" in row) == ("prompt" in row):
        raise ProtocolError(f"{where} must hold either messages or prompt (not both).", param=where)
    completion = row.get("completion")
    if not isinstance(completion, str) or not completion:
        raise ProtocolError(
            f"{where}.completion must be a non-empty string.", param=f"{where}.completion"
        )
    if "prompt" in row:
        prompt = row["prompt"]
        if not isinstance(prompt, str) or not prompt:
            raise ProtocolError(
                f"{where}.prompt must be a non-empty string.", param=f"{where}.prompt"
            )
        return Row(completion=completion, prompt=prompt)
    try:
        messages = parse_chat_messages(row["messages"])  # as /v1/chat/completions reads them
    except ProtocolError as exc:  # `messages[0].role ...` -> `rows[3].messages[0].role ...`
        raise type(exc)(f"{where}.{exc.message}", param=f"{where}.{exc.param}") from None
    return Row(completion=completion, messages=messages)


# ---------------------------------------------------------------- the version


def scorable_version(*, uid: uuid.UUID, served: ServedModel) -> AdapterVersion:
    """The version with this uid, if this engine may score it: ready, for the base model it
    serves, and checked compatible with the revision it runs. Not scoped to a tenant (the
    caller is an operator) and not through aliases or any evaluation gate: a version awaiting
    its evaluation must be scorable."""
    version = version_find_by_uid(uid=uid)
    if version is None:
        raise ModelNotFound(str(uid), param=ADAPTER_VERSION)
    reason = _why_not_scorable(version, served)
    if reason is not None:
        raise ModelNotServable(
            f"Adapter version {uid} ({version.adapter.tenant.slug}/{version.label}) cannot be "
            f"scored here: {reason}.",
            param=ADAPTER_VERSION,
        )
    return version


def _why_not_scorable(version: AdapterVersion, served: ServedModel) -> str | None:
    if version.status != version.READY:
        return f"it is {version.status}, not ready"
    if (base := version.adapter.base_model.name) != served.name:
        return f"it is for base model {base}; this engine serves {served.name}"
    if version.compatible is not True or version.checked_revision != served.revision:
        return (
            f"it is not checked compatible with revision {served.revision[:12]} of "
            f"{served.name}, which this engine serves"
        )
    return None


def _lora_request_for_uid(uid: uuid.UUID, served: ServedModel) -> LoRARequest:
    return lora_request_for(scorable_version(uid=uid, served=served))


# ---------------------------------------------------------------- tokens


def tokenize_rows(llm: LLMEngine, rows: list[Row]) -> list[TokenizedRow]:
    """Each row's prompt and completion ids; a row that cannot fit the context is refused
    (the scoring request also needs room for one token after the completion)."""
    tokenizer = llm.tokenizer
    room = llm.max_seq_len - 1
    turn_end = end_of_turn(llm) if any(row.messages is not None for row in rows) else []
    tokenized = []
    for i, row in enumerate(rows):
        where = f"{ROWS}[{i}]"
        if row.chars > llm.max_seq_len * tokenizer.max_token_chars:  # too long however it encodes
            raise _too_long(where, f"{row.chars} characters", room)
        try:
            prompt_ids = _row_prompt_ids(llm, row)
            completion_ids = tokenizer.encode(row.completion, add_special_tokens=False)
            if row.messages is not None:
                completion_ids += turn_end
        except TokenizerError as exc:  # e.g. the chat template rejects these messages
            field = "messages" if row.messages is not None else "prompt"
            raise ProtocolError(f"{where}.{field}: {exc}", param=f"{where}.{field}") from None
        if not prompt_ids or not completion_ids:
            raise ProtocolError(f"{where} encodes to no tokens.", param=where)
        if len(prompt_ids) + len(completion_ids) > room:
            tokens = f"{len(prompt_ids)} + {len(completion_ids)} tokens (prompt + completion)"
            raise _too_long(where, tokens, room)
        tokenized.append(TokenizedRow(prompt_ids, completion_ids))
    return tokenized


def _row_prompt_ids(llm: LLMEngine, row: Row) -> list[int]:
    if row.messages is not None:
        return chat_prompt_ids(llm, row.messages)
    assert row.prompt is not None, "a row holds messages or a prompt"
    return text_prompt_ids(llm, row.prompt)


def _too_long(where: str, size: str, room: int) -> ContextLengthExceeded:
    return ContextLengthExceeded(
        f"{where} is {size}; this model scores at most {room} tokens of prompt and completion "
        "together.",
        param=where,
    )


def end_of_turn(llm: LLMEngine) -> list[int]:
    """The token the chat template writes right after an assistant's text, if it is one that
    ends generation (ChatML's `<|im_end|>`): what the model says to end its turn. Else none (a
    template that ends turns with plain text or nothing, or that cannot render a reply)."""
    tokenizer = llm.tokenizer
    turn = [{"role": "user", "content": "?"}, {"role": "assistant", "content": _TURN_MARK}]
    try:
        rendered = tokenizer.apply_chat_template(turn, add_generation_prompt=False)
    except TokenizerError:
        return []
    _, found, after = rendered.partition(_TURN_MARK)
    ids = tokenizer.encode(after, add_special_tokens=False) if found else []
    return ids[:1] if ids and ids[0] in llm.eos_token_ids else []


# ---------------------------------------------------------------- scoring


async def score_rows(
    engine: AsyncLLMEngine,
    rows: list[TokenizedRow],
    lora_request: LoRARequest | None,
    *,
    concurrency: int = CONCURRENCY,
) -> list[RowScore]:
    """Each row under the adapter (when there is one) and under the base model, at background
    priority, at most `concurrency` rows at a time. If one fails, the others are aborted."""
    slots = asyncio.Semaphore(concurrency)

    async def nll(row: TokenizedRow, lora: LoRARequest | None) -> float:
        result = await engine.score(
            row.prompt_ids, row.completion_ids, lora, priority=Priority.BACKGROUND
        )
        return -sum(max(lp, MIN_LOGPROB) for lp in result.token_logprobs)  # JSON has no -inf

    async def one(row: TokenizedRow) -> RowScore:
        async with slots:
            if lora_request is None:
                return RowScore(len(row.completion_ids), None, await nll(row, None))
            adapter, base = await _all([nll(row, lora_request), nll(row, None)])
            return RowScore(len(row.completion_ids), adapter, base)

    return await _all([one(row) for row in rows])


async def _all(awaitables: list[Awaitable[T]]) -> list[T]:
    """asyncio.gather, but the first failure (or a cancellation) cancels the rest."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def summary(scores: list[RowScore], *, adapter: bool) -> dict | None:
    """Tokens, mean negative log-likelihood per token and perplexity over every row."""
    if adapter and any(s.adapter_nll is None for s in scores):
        return None
    tokens = sum(s.tokens for s in scores)
    total = sum((s.adapter_nll if adapter else s.base_nll) or 0.0 for s in scores)
    mean = total / tokens
    perplexity = math.exp(mean) if mean < math.log(sys.float_info.max) else sys.float_info.max
    return {"tokens": tokens, "nll": mean, "perplexity": perplexity}


def answer(version_uid: uuid.UUID | None, revision: str, scores: list[RowScore]) -> dict:
    return {
        ADAPTER_VERSION: None if version_uid is None else str(version_uid),
        "base_revision": revision,
        ROWS: [
            {"tokens": s.tokens, "adapter_nll": s.adapter_nll, "base_nll": s.base_nll}
            for s in scores
        ],
        "adapter": summary(scores, adapter=True) if version_uid is not None else None,
        "base": summary(scores, adapter=False),
    }


# ---------------------------------------------------------------- the request


async def score_request(raw: bytes) -> dict:
    """Everything that can refuse the request (the body, the version, the context length)
    is checked before anything reaches the engine."""
    body = parse_score_body(load_json(raw), limit=max_rows())
    engine = await HOST.started_engine()
    served = HOST.model
    assert served is not None, "set together with the engine"
    lora = None
    if body.version_uid is not None:
        lora = await sync_to_async(_lora_request_for_uid)(body.version_uid, served)
    rows = await sync_to_async(tokenize_rows, thread_sensitive=False)(engine.engine, body.rows)
    scores = await score_rows(engine, rows, lora)
    return answer(body.version_uid, served.revision, scores)
