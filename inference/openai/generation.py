"""One OpenAI-style generation, from the raw HTTP request to the last byte of its answer,
for every endpoint that generates (serving_chat.py, serving_completion.py say what differs).

`prepare` does everything that can refuse a request (auth, parsing, limits, model
resolution, tokenizing) before anything reaches the engine, so a refusal costs the engine
nothing. Rendering and tokenizing a prompt run in a worker thread (a megabyte takes the best
part of a second), after a length check that needs no tokenizer. The request then fans out
into engine requests, `n` choices (or `best_of` candidates) for each of its prompts
(fan_out.py), read as one stream of `(choice index, output)` (choices.py). `respond_json`
and `respond_stream` drive that stream; every request, however it ends (even a client gone
before its stream began), leaves one usage record and releases its concurrency slot, once.
"""

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from asgiref.sync import sync_to_async
from django.conf import settings

from inference import ratelimit, usage
from inference.auth import inference_principal_async
from inference.engine import EngineRequest, SamplingParams
from inference.errors import ContextLengthExceeded, ProtocolError
from inference.host.engine_host import HOST
from inference.metrics import HTTP_REQUESTS
from inference.resolution import ResolvedModel, resolve_model
from platform_site.error_responses import error_body, to_api_error
from platform_site.errors import RequestTooLarge
from platform_site.request_end import on_request_end
from tenants.models import UsageRecord
from tenants.principal import Principal

from .choices import ChoiceStreams
from .completion_builder import SSE_DONE, CompletionBuilder, sse
from .constraints import compile_constraint
from .echo import EchoedPrompt, echoed_prompts
from .fan_out import candidate_kwargs, candidates, engine_tokens
from .max_tokens import max_tokens_for
from .protocol import GenerationRequest, load_json
from .response_size import refuse_oversized_response
from .sampling_options import check_min_tokens, check_token_ids
from .tokenizing import refuse_long_text, tokenize_off_loop

if TYPE_CHECKING:
    from inference.engine import AsyncLLMEngine, LLMEngine


@dataclass(frozen=True)
class Endpoint:
    """What sets one generating endpoint apart: how its body reads, what it refuses that the
    model cannot do, and how its prompts become token ids."""

    kind: str  # the builder's and the metrics' name: "chat" or "text"
    usage_name: str  # the endpoint a usage record names
    parse: Callable[[dict], GenerationRequest]
    # Each prompt's token ids: one prompt, or a completions batch of them.
    prompt_ids: Callable[["LLMEngine", GenerationRequest], list[list[int]]]
    check: Callable[[GenerationRequest, "LLMEngine"], None] = lambda parsed, llm: None
    # What the request refers to, read for this caller once it is known and within its limits
    # (the Responses API: the stored conversation a `previous_response_id` continues).
    context: Callable[[GenerationRequest, Principal], None] = lambda parsed, principal: None


@dataclass
class Prepared:
    endpoint: Endpoint
    parsed: GenerationRequest
    principal: Principal
    resolved: ResolvedModel
    engine: "AsyncLLMEngine"
    prompt_ids: list[list[int]]  # each prompt's
    params: list[SamplingParams]  # one per engine request, prompt-major (fan_out.py)
    builder: CompletionBuilder
    include_usage: bool
    stream: bool
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    started: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    outputs: ChoiceStreams = field(init=False)  # set by prepare() once the engine took them
    finished: bool = False  # finish() ran: the slot is released and the usage recorded
    reservation: ratelimit.Reservation | None = None  # tokens set aside, settled by finish()

    @property
    def kind(self) -> str:
        return self.endpoint.kind


async def prepare(request, endpoint: Endpoint) -> Prepared:
    principal = await inference_principal_async(request)
    # Parsing and schema checks off the event loop, which only moves bytes.
    parsed = await sync_to_async(_parse, thread_sensitive=False)(endpoint, request)
    await sync_to_async(_check_limits_and_context)(endpoint, parsed, principal)
    engine = await HOST.started_engine()
    resolved = await sync_to_async(resolve_model)(
        tenant=principal.tenant, name=parsed.model, base_model_name=HOST.served_name()
    )
    llm = engine.engine
    endpoint.check(parsed, llm)
    check_token_ids(parsed.sampling, llm.config.model_config.vocab_size)
    refuse_overlong_text(parsed, llm)
    # One of the tenant's tokenization slots, in a worker thread (tokenizing.py).
    prompt_ids = await tokenize_off_loop(principal.tenant.id, endpoint.prompt_ids, llm, parsed)
    assert all(isinstance(ids, list) for ids in prompt_ids), "a list of token ids per prompt"
    lengths = [len(ids) for ids in prompt_ids]
    max_tokens = [_max_tokens(parsed, llm, length) for length in lengths]
    check_min_tokens(parsed.sampling, min(max_tokens), parsed.max_tokens_param)
    refuse_oversized_answer(parsed, endpoint, lengths, max_tokens)
    echoes = None
    if parsed.echo and parsed.prompts is not None:
        echo = sync_to_async(echoed_prompts, thread_sensitive=False)
        echoes = await echo(llm.tokenizer, parsed.prompts, prompt_ids)
    await sync_to_async(refuse_oversized_response, thread_sensitive=False)(
        parsed, endpoint.kind, llm.tokenizer, prompt_ids, max_tokens, echoes
    )
    params = await _sampling_params(parsed, engine, max_tokens)
    prepared = Prepared(
        endpoint=endpoint,
        parsed=parsed,
        principal=principal,
        resolved=resolved,
        engine=engine,
        prompt_ids=prompt_ids,
        params=params,
        builder=_builder(endpoint, parsed, llm, lengths, echoes),
        include_usage=parsed.include_usage,
        stream=parsed.stream,
    )
    await _admit(
        prepared, tokens=engine_tokens(parsed, sum(lengths), sum(p.max_tokens for p in params))
    )
    return prepared


def _check_limits_and_context(endpoint: Endpoint, parsed, principal) -> None:
    """The caller's request rate and token budget, then the endpoint's context (a stored
    response, say): one visit to the thread that may touch the database, not three."""
    ratelimit.check_request_rate(principal=principal)
    ratelimit.check_token_budget(tenant_id=principal.tenant.id)
    endpoint.context(parsed, principal)


def _parse(endpoint: Endpoint, request) -> GenerationRequest:
    length = int(request.META.get("CONTENT_LENGTH") or 0)
    if length > settings.MAX_REQUEST_BYTES:
        raise RequestTooLarge(
            f"The request body is {length} bytes; the limit is {settings.MAX_REQUEST_BYTES}."
        )
    return endpoint.parse(load_json(request.body))


def _max_tokens(parsed: GenerationRequest, llm: "LLMEngine", prompt_tokens: int) -> int:
    """Each choice's budget: the request's or the deployment's default, within the context."""
    room = llm.max_seq_len - prompt_tokens
    if room < 1:
        raise ContextLengthExceeded(
            f"The prompt is {prompt_tokens} tokens; this model's context holds "
            f"{llm.max_seq_len} including at least one generated token.",
            param=_prompt_param(parsed),
        )
    max_tokens = max_tokens_for(parsed.max_tokens, parsed.max_tokens_param, room)
    if max_tokens > room:
        param = parsed.max_tokens_param
        raise ContextLengthExceeded(
            f"{param} is {max_tokens} but the prompt ({prompt_tokens} tokens) leaves room "
            f"for {room} in this model's {llm.max_seq_len}-token context.",
            param=param,
        )
    return max_tokens


async def _sampling_params(
    parsed: GenerationRequest, engine: "AsyncLLMEngine", max_tokens: list[int]
) -> list[SamplingParams]:
    """One per engine request (each prompt's candidates, with that prompt's budget); the
    JSON the output must be is compiled here, off the event loop."""
    constrained: dict = {}
    if parsed.constraint is not None:
        constrained["structured_output"] = await compile_constraint(engine, parsed.constraint)
    return [
        SamplingParams(**candidate_kwargs(parsed, candidate, budget), **constrained)
        for budget in max_tokens
        for candidate in range(candidates(parsed))
    ]


def _builder(
    endpoint: Endpoint,
    parsed: GenerationRequest,
    llm: "LLMEngine",
    prompt_lengths: list[int],
    echoes: list[EchoedPrompt] | None,
) -> CompletionBuilder:
    return CompletionBuilder(
        kind=endpoint.kind,
        model=parsed.model,
        logprobs=parsed.logprobs,
        n=parsed.n,
        prompt_logprobs=parsed.prompt_logprobs,
        tool_use=parsed.tool_use,
        prompts=len(prompt_lengths),
        best_of=parsed.best_of,
        echo=echoes,
        echo_only=parsed.echo and parsed.max_tokens == 0,
        prompt_lengths=prompt_lengths,
        continuous_usage=parsed.continuous_usage,
        decode_token=lambda tid: llm.tokenizer.decode([tid], skip_special_tokens=False),
    )


async def _admit(prepared: Prepared, *, tokens: int) -> None:
    """The tenant's concurrency slot and token reservation, then the engine takes the
    choices; whatever refuses the request gives both back."""
    tenant_id = prepared.principal.tenant.id
    ratelimit.acquire_slot(tenant_id)
    try:
        prepared.reservation = await sync_to_async(ratelimit.reserve_tokens)(
            tenant_id=tenant_id, tokens=tokens
        )
        prepared.outputs = _start(prepared)  # the engine validates here: errors are still 4xx
    except BaseException:
        ratelimit.release_slot(tenant_id)
        ratelimit.settle_tokens(prepared.reservation, used=0)
        raise
    _finish_when_the_request_ends(prepared)


def refuse_oversized_answer(
    parsed: GenerationRequest, endpoint: Endpoint, prompt_tokens: list[int], max_tokens: list[int]
) -> None:
    """An answer's logprobs are known in count before a token is generated: one that would
    run to hundreds of megabytes is refused, naming the parameter that makes it so. Counted
    over the whole request: every prompt of a batch (`prompt_tokens`, `max_tokens`: each
    one's), every returned choice."""
    limit = settings.MAX_LOGPROB_ENTRIES
    # The prompt's logprobs are computed once; the completions API repeats them per choice.
    copies = parsed.n if endpoint.kind == "text" else 1
    # With echo, each choice's logprobs cover its prompt's tokens before its own.
    tokens = sum(max_tokens) + (sum(prompt_tokens) if parsed.echo else 0)
    parts = {
        "prompt_logprobs": 0
        if parsed.prompt_logprobs is None
        else sum(prompt_tokens) * (1 + parsed.prompt_logprobs) * copies,
        _logprobs_param(endpoint): 0
        if parsed.logprobs is None
        else parsed.n * tokens * (1 + parsed.logprobs),
    }
    entries = sum(parts.values())
    if limit and entries > limit:
        param = max(parts, key=lambda name: parts[name])
        prompts = f" in {len(prompt_tokens)} prompts" if len(prompt_tokens) > 1 else ""
        raise ProtocolError(
            f"The answer would hold {entries} logprob entries ({param}: {parts[param]}, over "
            f"{sum(prompt_tokens)} prompt tokens{prompts}, {parsed.n} choices and up to "
            f"{max(max_tokens)} tokens each); at most {limit} (LORAPLEX_MAX_LOGPROB_ENTRIES). "
            f"Lower {param}, n or {parsed.max_tokens_param}.",
            param=param,
        )


def _logprobs_param(endpoint: Endpoint) -> str:
    return "top_logprobs" if endpoint.kind == "chat" else "logprobs"


def _prompt_param(parsed: GenerationRequest) -> str:
    return "messages" if parsed.messages is not None else "prompt"


def refuse_overlong_text(parsed: GenerationRequest, llm: "LLMEngine") -> None:
    """A text over the characters a prompt may hold (tokenizing.py: max_model_len x
    characters per token) is refused without spending a second tokenizing it."""
    if parsed.prompts is None:
        size = sum(len(m["content"] or "") for m in parsed.messages or [])
        _refuse_longer(llm, size, "characters", "The prompt", _prompt_param(parsed))
        return
    for i, prompt in enumerate(parsed.prompts):  # a completion's: each prompt on its own
        where = f"prompt[{i}]" if len(parsed.prompts) > 1 else "The prompt"
        unit = "tokens" if isinstance(prompt, list) else "characters"
        _refuse_longer(llm, len(prompt), unit, where, "prompt")


def _refuse_longer(llm: "LLMEngine", size: int, unit: str, where: str, param: str) -> None:
    if unit == "characters":
        refuse_long_text(llm, size, where=where, param=param)
        return
    if size > llm.max_seq_len - 1:
        raise ContextLengthExceeded(
            f"{where} is {size} {unit}; this model's context holds {llm.max_seq_len} tokens "
            "including at least one generated token.",
            param=param,
        )


def _finish_when_the_request_ends(prepared: Prepared) -> None:
    """A client gone between `prepare` and the stream's first byte cancels the view (or the
    middleware after it) with the body never started, so its `finally` never runs. The
    request's end comes after every task serving it has ended (platform_site/request_end.py):
    unfinished then, nobody read the outputs."""

    on_request_end(lambda: finish(prepared, UsageRecord.ABORTED))


def _start(prepared: Prepared) -> ChoiceStreams:
    """One engine request per candidate of each prompt (fan_out.py), on that prompt's
    tokens, the same adapter and fairness key (the tenant). If the engine refuses one, those
    already queued are aborted."""
    per_prompt = len(prepared.params) // len(prepared.prompt_ids)
    streams = []
    try:
        for choice, params in enumerate(prepared.params):
            streams.append(
                prepared.engine.generate(
                    EngineRequest(
                        f"{prepared.request_id}-{choice}",
                        sampling_params=params,
                        prompt_token_ids=prepared.prompt_ids[choice // per_prompt],
                        lora_request=prepared.resolved.lora_request,
                        fairness_key=str(prepared.principal.tenant.id),
                        model_name=prepared.resolved.requested,
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
            note_first_token(prepared, out)
            prepared.builder.add(index, out)
        status = UsageRecord.ABORTED if prepared.builder.aborted else UsageRecord.OK
        return prepared.builder.final_body()
    except asyncio.CancelledError:
        status = UsageRecord.ABORTED
        raise
    finally:
        finish(prepared, status)


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
            note_first_token(prepared, out)
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
        finish(prepared, status)


def note_first_token(prepared: Prepared, out):
    if prepared.first_token_at is None and out.new_token_ids:
        prepared.first_token_at = time.monotonic()


def finish(prepared: Prepared, status: str):
    """Once, however the request ended: the choices still running aborted, the slot released,
    the unused tokens given back, one usage record queued (an endpoint that builds its own
    answer from `prepared.outputs` calls it the same way)."""
    if prepared.finished:
        return
    prepared.finished = True
    prepared.outputs.close()  # aborts the choices not finished (a client gone, an error)
    ratelimit.release_slot(prepared.principal.tenant.id)
    b = prepared.builder
    ratelimit.settle_tokens(
        prepared.reservation,
        used=engine_tokens(prepared.parsed, b.prompt_tokens, b.completion_tokens),
    )
    HTTP_REQUESTS.labels(endpoint=prepared.kind, status=status).inc()
    now = time.monotonic()
    usage.start_writer()
    usage.record(
        tenant_id=prepared.principal.tenant.id,
        api_key_id=prepared.principal.api_key.id if prepared.principal.api_key else None,
        adapter_version_id=prepared.resolved.version.id if prepared.resolved.version else None,
        model=b.model,
        endpoint=prepared.endpoint.usage_name,
        prompt_tokens=b.prompt_tokens,
        completion_tokens=b.completion_tokens,
        ttft_ms=int((prepared.first_token_at - prepared.started) * 1000)
        if prepared.first_token_at
        else None,
        duration_ms=int((now - prepared.started) * 1000),
        status=status,
    )
