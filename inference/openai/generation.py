"""One OpenAI-style generation, from the raw HTTP request to the last byte of its answer.

`prepare` does everything that can refuse a request (auth, parsing, limits, model
resolution, tokenizing) before anything reaches the engine, so a refusal costs the engine
nothing; each refusal is an ApiError (inference/errors.py) or one of the engine's own,
which the view answers through platform_site/error_responses.py. Rendering and tokenizing
a prompt run in a worker thread (a megabyte takes the best part of a second), after a
length check that needs no tokenizer. The request then fans out into `n` engine requests,
one per choice, read as one stream of `(choice index, output)` (inference/choices.py).
`respond_json` and `respond_stream` drive that stream; every request, however it ends
(even a client gone before its stream began), leaves one usage record and releases its
concurrency slot, once.
"""

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from asgiref.sync import sync_to_async
from django.conf import settings

from inference.engine import EngineRequest, SamplingParams
from platform_site.error_responses import error_body, to_api_error
from platform_site.errors import RequestTooLarge
from platform_site.request_end import on_request_end
from tenants.models import UsageRecord
from tenants.principal import Principal

from . import ratelimit, usage
from .auth import inference_principal
from .choices import ChoiceStreams
from .constraints import compile_constraint
from .engine_host import HOST
from .errors import ContextLengthExceeded, ProtocolError
from .max_tokens import max_tokens_for
from .metrics import HTTP_REQUESTS
from .openai_protocol import load_json, parse_chat_request, parse_completion_request
from .openai_responses import SSE_DONE, CompletionBuilder, sse
from .resolution import ResolvedModel, resolve_model

if TYPE_CHECKING:
    from inference.engine import AsyncLLMEngine


@dataclass
class Prepared:
    kind: str  # "chat" or "text"
    principal: Principal
    resolved: ResolvedModel
    engine: "AsyncLLMEngine"
    prompt_ids: list[int]
    params: list[SamplingParams]  # one per choice
    builder: CompletionBuilder
    include_usage: bool
    stream: bool
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    started: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    outputs: ChoiceStreams = field(init=False)  # set by prepare() once the engine took them
    finished: bool = False  # _finish ran: the slot is released and the usage recorded
    reservation: ratelimit.Reservation | None = None  # tokens set aside, settled by _finish


async def prepare(request, kind: str) -> Prepared:
    principal = await sync_to_async(inference_principal)(request)
    length = int(request.META.get("CONTENT_LENGTH") or 0)
    if length > settings.MAX_REQUEST_BYTES:
        raise RequestTooLarge(
            f"The request body is {length} bytes; the limit is {settings.MAX_REQUEST_BYTES}."
        )
    body = load_json(request.body)
    parsed = parse_chat_request(body) if kind == "chat" else parse_completion_request(body)
    await sync_to_async(ratelimit.check_request_rate)(principal=principal)
    await sync_to_async(ratelimit.check_token_budget)(tenant_id=principal.tenant.id)
    engine = HOST.engine or await sync_to_async(HOST.start, thread_sensitive=False)()
    assert HOST.model is not None, "set together with the engine"
    resolved = await sync_to_async(resolve_model)(
        tenant=principal.tenant, name=parsed.model, base_model_name=HOST.model.name
    )
    llm = engine.engine
    if parsed.tool_use is not None and not llm.tokenizer.supports_tools:
        raise ProtocolError(
            "This model's chat template does not support tools: it would not show them to "
            'the model. Send no tools, or tool_choice "none".',
            param="tools",
        )
    _refuse_overlong_text(parsed, llm)
    tools = parsed.tool_use.template_tools() if parsed.tool_use is not None else None
    prompt_ids = await sync_to_async(_prompt_ids, thread_sensitive=False)(
        llm.tokenizer, parsed, tools
    )
    room = llm.max_seq_len - len(prompt_ids)
    if room < 1:
        raise ContextLengthExceeded(
            f"The prompt is {len(prompt_ids)} tokens; this model's context holds {llm.max_seq_len} "
            "including at least one generated token.",
            param="messages" if parsed.messages is not None else "prompt",
        )
    max_tokens = max_tokens_for(parsed.max_tokens, parsed.max_tokens_param, room)
    if max_tokens > room:
        param = parsed.max_tokens_param
        raise ContextLengthExceeded(
            f"{param} is {max_tokens} but the prompt ({len(prompt_ids)} tokens) leaves room "
            f"for {room} in this model's {llm.max_seq_len}-token context.",
            param=param,
        )
    constrained: dict = {}  # the JSON the output must be, compiled off the event loop
    if parsed.constraint is not None:
        constrained["structured_output"] = await compile_constraint(engine, parsed.constraint)
    params = [
        SamplingParams(max_tokens=max_tokens, **parsed.sampling_kwargs(choice), **constrained)
        for choice in range(parsed.n)
    ]
    builder = CompletionBuilder(
        kind=kind,
        model=parsed.model,
        logprobs=parsed.logprobs,
        n=parsed.n,
        prompt_logprobs=parsed.prompt_logprobs,
        tool_use=parsed.tool_use,
        decode_token=lambda tid: llm.tokenizer.decode([tid], skip_special_tokens=False),
    )
    prepared = Prepared(
        kind=kind,
        principal=principal,
        resolved=resolved,
        engine=engine,
        prompt_ids=prompt_ids,
        params=params,
        builder=builder,
        include_usage=parsed.include_usage,
        stream=parsed.stream,
    )
    ratelimit.acquire_slot(principal.tenant.id)
    try:
        prepared.reservation = await sync_to_async(ratelimit.reserve_tokens)(
            tenant_id=principal.tenant.id, tokens=len(prompt_ids) + parsed.n * max_tokens
        )
        prepared.outputs = _start(prepared)  # the engine validates here: errors are still 4xx
    except BaseException:
        ratelimit.release_slot(principal.tenant.id)
        ratelimit.settle_tokens(prepared.reservation, used=0)
        raise
    _finish_when_the_request_ends(prepared)
    return prepared


def _refuse_overlong_text(parsed, llm) -> None:
    """No token covers more than `max_token_chars` characters, so a longer text cannot fit
    the context however it tokenizes: refuse it without spending a second tokenizing it."""
    if isinstance(parsed.prompt, list):
        size, unit, bound = len(parsed.prompt), "tokens", llm.max_seq_len - 1
    else:
        texts = [m["content"] for m in parsed.messages] if parsed.messages else [parsed.prompt]
        size, unit = sum(len(t) for t in texts), "characters"
        bound = llm.max_seq_len * llm.tokenizer.max_token_chars
    if size > bound:
        raise ContextLengthExceeded(
            f"The prompt is {size} {unit}; this model's context holds {llm.max_seq_len} tokens "
            "including at least one generated token.",
            param="messages" if parsed.messages is not None else "prompt",
        )


def _prompt_ids(tokenizer, parsed, tools: list[dict] | None = None) -> list[int]:
    """`tools`: the function definitions the chat template shows the model."""
    if parsed.messages is not None:
        text = tokenizer.apply_chat_template(
            parsed.messages, add_generation_prompt=True, tools=tools
        )
        return tokenizer.encode(text, add_special_tokens=False)
    if isinstance(parsed.prompt, list):
        bad = [t for t in parsed.prompt if t >= tokenizer.vocab_size]
        if bad:
            raise ProtocolError(
                f"prompt holds token id {bad[0]}, outside the vocabulary of "
                f"{tokenizer.vocab_size}.",
                param="prompt",
            )
        return list(parsed.prompt)
    return tokenizer.encode(parsed.prompt)


def _finish_when_the_request_ends(prepared: Prepared) -> None:
    """A client gone between `prepare` and the stream's first byte cancels the view (or the
    middleware after it) with the body never started, so its `finally` never runs. The
    request's end comes after every task serving it has ended (platform_site/request_end.py):
    unfinished then, nobody read the outputs."""

    on_request_end(lambda: _finish(prepared, UsageRecord.ABORTED))


def _start(prepared: Prepared) -> ChoiceStreams:
    """One engine request per choice, on the same prompt tokens, adapter and fairness key
    (the tenant). If the engine refuses one, those already queued are aborted."""
    streams = []
    try:
        for choice, params in enumerate(prepared.params):
            streams.append(
                prepared.engine.generate(
                    EngineRequest(
                        f"{prepared.request_id}-{choice}",
                        sampling_params=params,
                        prompt_token_ids=prepared.prompt_ids,
                        lora_request=prepared.resolved.lora_request,
                        fairness_key=str(prepared.principal.tenant.id),
                    )
                )
            )
    except BaseException:
        for stream in streams:
            stream.close()
        raise
    return ChoiceStreams(streams)


async def respond_json(prepared: Prepared) -> dict:
    status = UsageRecord.ERROR
    try:
        async for index, out in prepared.outputs:
            _note_first_token(prepared, out)
            prepared.builder.add(index, out)
        status = UsageRecord.ABORTED if prepared.builder.aborted else UsageRecord.OK
        return prepared.builder.final_body()
    except asyncio.CancelledError:
        status = UsageRecord.ABORTED
        raise
    finally:
        _finish(prepared, status)


async def respond_stream(prepared: Prepared):
    """The SSE body: the choices' chunks interleaved as they come, each with its `index`.
    Cancelled when the client disconnects, which aborts the engine requests."""
    status = UsageRecord.ERROR
    builder = prepared.builder
    try:
        if prepared.kind == "chat":
            for role_chunk in builder.first_chunks():
                yield sse(role_chunk)
        async for index, out in prepared.outputs:
            _note_first_token(prepared, out)
            chunk = builder.add(index, out)
            if chunk is not None:
                yield sse(chunk)
        if prepared.include_usage:
            yield sse(builder.usage_chunk())
        yield SSE_DONE
        status = UsageRecord.ABORTED if builder.aborted else UsageRecord.OK
    except (asyncio.CancelledError, GeneratorExit):  # the client went away (mid-yield: closed)
        status = UsageRecord.ABORTED
        raise
    except (
        Exception
    ) as exc:  # e.g. the adapter failed to load; the headers are sent: say it in-stream
        yield sse(error_body(to_api_error(exc)))
        yield SSE_DONE
    finally:
        _finish(prepared, status)


def _note_first_token(prepared: Prepared, out):
    if prepared.first_token_at is None and out.new_token_ids:
        prepared.first_token_at = time.monotonic()


def _finish(prepared: Prepared, status: str):
    if prepared.finished:
        return
    prepared.finished = True
    prepared.outputs.close()  # aborts the choices not finished (a client gone, an error)
    ratelimit.release_slot(prepared.principal.tenant.id)
    b = prepared.builder
    ratelimit.settle_tokens(
        prepared.reservation,
        used=(b.prompt_tokens or len(prepared.prompt_ids)) + b.completion_tokens,
    )
    HTTP_REQUESTS.labels(endpoint=prepared.kind, status=status).inc()
    now = time.monotonic()
    usage.start_writer()
    usage.record(
        tenant_id=prepared.principal.tenant.id,
        api_key_id=prepared.principal.api_key.id if prepared.principal.api_key else None,
        adapter_version_id=prepared.resolved.version.id if prepared.resolved.version else None,
        model=b.model,
        endpoint="chat.completions" if prepared.kind == "chat" else "completions",
        prompt_tokens=b.prompt_tokens or len(prepared.prompt_ids),
        completion_tokens=b.completion_tokens,
        ttft_ms=int((prepared.first_token_at - prepared.started) * 1000)
        if prepared.first_token_at
        else None,
        duration_ms=int((now - prepared.started) * 1000),
        status=status,
    )
