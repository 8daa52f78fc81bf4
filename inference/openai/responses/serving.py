"""POST /v1/responses through the shared generation flow: the chat endpoint's template and
tool checks, the Responses API's body, its stored conversation read for the caller's tenant
(`previous_response_id`), then the answer as a response object or OpenAI's typed events, kept
(unless `store: false`) before the client learns it is complete."""

import asyncio
from dataclasses import replace

from asgiref.sync import sync_to_async

from inference.errors import ProtocolError
from platform_site.error_responses import to_api_error
from tenants.models import UsageRecord
from tenants.principal import Principal

from ..generation import Prepared, finish, note_first_token, prepare
from ..protocol import GenerationRequest
from ..serving_chat import CHAT
from .answer import ResponseAnswer, sse_event
from .input_items import output_as_input
from .protocol import ResponsesRequest, parse_responses_request
from .store import stored_conversation, stored_response_save


def _continue_stored(parsed: GenerationRequest, principal: Principal) -> None:
    assert isinstance(parsed, ResponsesRequest)
    if parsed.previous_response_id is not None:
        stored = stored_conversation(
            tenant=principal.tenant,
            response_id=parsed.previous_response_id,
            param="previous_response_id",
        )
        parsed.continue_from(stored)


RESPONSES = replace(
    CHAT, usage_name="responses", parse=parse_responses_request, context=_continue_stored
)


async def prepare_response(request) -> tuple[Prepared, ResponseAnswer]:
    try:
        prepared = await prepare(request, RESPONSES)
    except ProtocolError as exc:
        if exc.param != "messages":
            raise
        # The shared flow names the chat API's field for the prompt; here it is `input`.
        raise type(exc)(exc.message, param="input") from None
    assert isinstance(prepared.parsed, ResponsesRequest)
    return prepared, ResponseAnswer(prepared.parsed)


async def respond_json(prepared: Prepared, answer: ResponseAnswer) -> dict:
    status = UsageRecord.ERROR
    try:
        async for index, out in prepared.outputs:
            note_first_token(prepared, out)
            answer.add(prepared.builder.add(index, out))
        status = UsageRecord.ABORTED if prepared.builder.aborted else UsageRecord.OK
    except asyncio.CancelledError:
        status = UsageRecord.ABORTED
        raise
    finally:
        finish(prepared, status)
    _close(prepared, answer)
    await _keep(prepared, answer)
    return answer.body()


async def respond_stream(prepared: Prepared, answer: ResponseAnswer):
    """The SSE body: the opening events, each chunk's, then the closing ones (the terminal
    event after the response is stored). Cancelled when the client disconnects, which
    aborts the engine request."""
    status = UsageRecord.ERROR
    try:
        for event in answer.opening():
            yield sse_event(event)
        async for index, out in prepared.outputs:
            note_first_token(prepared, out)
            for event in answer.add(prepared.builder.add(index, out)):
                yield sse_event(event)
        status = UsageRecord.ABORTED if prepared.builder.aborted else UsageRecord.OK
        closing = _close(prepared, answer)
        await _keep(prepared, answer)
        for event in closing:
            yield sse_event(event)
    except (asyncio.CancelledError, GeneratorExit):  # the client went away
        status = UsageRecord.ABORTED
        raise
    except Exception as exc:  # the headers are sent: say it in-stream
        yield sse_event(answer.error_event(to_api_error(exc)))
    finally:
        finish(prepared, status)


def _close(prepared: Prepared, answer: ResponseAnswer) -> list[dict]:
    builder = prepared.builder
    return answer.closing(finish_reason=builder.choices[0].finish_reason, usage=builder.usage())


async def _keep(prepared: Prepared, answer: ResponseAnswer) -> None:
    """With `store` on, the response and the conversation it ends, for its tenant."""
    parsed = answer.request
    if not parsed.store:
        return
    body = answer.body()
    await sync_to_async(stored_response_save)(
        tenant_id=prepared.principal.tenant.id,
        body=body,
        conversation=parsed.conversation + output_as_input(body["output"]),
    )
