"""AsyncLLMEngine: many asyncio callers, one engine, one step thread.

Only the step thread touches the LLMEngine's state. Callers validate their request in
their own thread (errors raise at once), then hand the ready Sequence over through a
command queue; outputs go back to each caller's event loop with `call_soon_threadsafe`.
A caller that stops listening (cancelled, closed or dropped its stream) aborts its request.
The LoRA controls (load, unload, pin) are coroutines whose work travels the same queue, so
they take effect between steps, never in the middle of one.

If the step thread raises, the engine is dead, as in vLLM: its state (KV blocks half
written, an adapter half swapped in, a CUDA context an illegal access has poisoned) can no
longer be trusted. Every request it holds fails with EngineDeadError, new ones are refused,
`is_alive()` turns false, and `on_failure` tells the owner, who should replace the process.
"""

import asyncio
import contextlib
import logging
import queue
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from contextlib import suppress
from typing import Any

from .config import EngineConfig
from .errors import DuplicateRequestError, EngineDeadError, EngineError, EngineStoppedError
from .llm_engine import LLMEngine
from .outputs import RequestOutput
from .request import EngineRequest, LoRARequest, Priority
from .scoring import ScoreResult, score_request, score_result
from .sequence import Sequence
from .structured_output import StructuredOutput
from .utils import drain

logger = logging.getLogger(__name__)

# What a stream's queue carries: an output, or an exception to raise to the caller.
StreamItem = RequestOutput | BaseException
# A LoRA control run on the step thread: (function, its arguments, the caller's future).
Call = tuple[Callable[..., Any], tuple[Any, ...], Future[Any]]
# The step thread's commands: ("add", Sequence), ("abort", request id) or ("call", Call).
Command = tuple[str, Any]


class RequestStream:
    """The deltas of one request, as an async iterator. Ends after the output whose
    `finished` is set; stopping early (cancel, `aclose()`, or dropping it) aborts the request
    through `on_close(request_id)`."""

    def __init__(
        self, request_id: str, loop: asyncio.AbstractEventLoop, on_close: Callable[[str], None]
    ):
        self.request_id = request_id
        self.loop = loop
        self.queue: asyncio.Queue[StreamItem] = asyncio.Queue()
        self._on_close = on_close
        self._done = False

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> RequestOutput:
        if self._done:
            raise StopAsyncIteration
        try:
            item = await self.queue.get()
        except BaseException:  # cancelled: the caller went away
            self._stop()
            raise
        if isinstance(item, BaseException):
            self._done = True
            raise item
        self._done = item.finished
        return item

    async def aclose(self) -> None:
        self._stop()

    def close(self) -> None:
        """Stop listening from synchronous code (a callback): the same as `aclose()`."""
        self._stop()

    def put(self, item: StreamItem) -> None:
        """Hand an item to the caller's event loop (from any thread). RuntimeError if that
        loop is closed."""
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    def __del__(self) -> None:
        self._stop()

    def _stop(self) -> None:
        if not self._done:
            self._done = True
            self._on_close(self.request_id)


class AsyncLLMEngine:
    def __init__(
        self, engine: LLMEngine, on_failure: Callable[[BaseException], None] | None = None
    ):
        """`on_failure(error)` is called once, on the step thread, if the step loop raises."""
        self.engine = engine
        self._commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._wakeup = threading.Event()
        self._lock = threading.Lock()  # guards _streams, _calls, _stopped and failure
        self._streams: dict[str, RequestStream] = {}
        self._calls: set[Future[Any]] = set()  # LoRA controls not answered yet
        self._stopped = False
        self.failure: BaseException | None = None  # what killed the step loop, if it died
        self._on_failure = on_failure
        engine.on_load_finished(self._wakeup.set)  # a finished load may unblock requests
        self._thread = threading.Thread(target=self._run, name="loraplex-engine-step", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, config: EngineConfig | None = None, **kwargs: Any) -> "AsyncLLMEngine":
        return cls(LLMEngine(config, **kwargs))

    def generate(self, request: EngineRequest) -> RequestStream:
        """Queue a request and return its stream of deltas. Call it from a coroutine; a bad
        request raises here, before anything is queued. If its adapter cannot be loaded, the
        stream raises AdapterLoadError (whose message names the failed checks)."""
        loop = asyncio.get_running_loop()
        seq = self.engine.make_sequence(request)
        with self._lock:
            if self._stopped:
                raise self._refusal()
            if seq.request_id in self._streams:
                raise DuplicateRequestError(
                    f"request id {seq.request_id!r} is already in use; give each request a "
                    f"unique id"
                )
            stream = self._streams[seq.request_id] = RequestStream(
                seq.request_id, loop, self._stream_closed
            )
            self._send(("add", seq))  # under the lock, so shutdown cannot miss it
        return stream

    async def score(
        self,
        prompt_token_ids: list[int],
        completion_token_ids: list[int],
        lora_request: LoRARequest | None = None,
        *,
        priority: int = Priority.BACKGROUND,
    ) -> ScoreResult:
        """log P(completion | prompt) under the adapter (or the base model), computed without
        generating, behind tenants' traffic unless `priority` says otherwise."""
        request = score_request(
            f"score-{uuid.uuid4().hex}",
            prompt_token_ids,
            completion_token_ids,
            lora_request,
            priority,
        )
        prompt_logprobs = None
        async with contextlib.aclosing(self.generate(request)) as outputs:
            async for out in outputs:
                prompt_logprobs = out.prompt_logprobs or prompt_logprobs
        return score_result(prompt_logprobs, len(prompt_token_ids))

    async def compile_structured_output(self, spec: StructuredOutput) -> None:
        """Compile (or find cached) a structured output's grammar on a worker thread, so a
        request's bad schema raises here, before it is queued: UnsupportedSchemaError (the
        message names what is wrong) or StructuredOutputUnavailableError."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.engine.structured.compile, spec)

    def abort(self, request_id: str) -> None:
        """Stop a request; its stream, if still read, ends with finish_reason "abort"."""
        self._send(("abort", request_id))

    def stats(self) -> dict[str, Any]:
        return self.engine.stats()

    def is_alive(self) -> bool:
        """Whether the step thread is running (false once shut down or if it failed)."""
        return self._thread.is_alive() and not self._stopped

    # -- LoRA controls: run on the step thread, between steps --------------------------------

    async def load_lora(self, lora_request: LoRARequest, pin: bool = False) -> None:
        """Bring an adapter into host memory (and, with `pin`, keep it in a device slot).
        Returns once it is loaded; raises AdapterLoadError naming the failed checks."""
        self.engine.check_lora_request(lora_request)
        await asyncio.wrap_future(self._call(self.engine.load_lora, lora_request, pin))

    async def unload_lora(self, adapter_id: str) -> bool:
        """True if the adapter was known and is now dropped; refused while requests use it."""
        unloaded: bool = await asyncio.wrap_future(self._call(self.engine.unload_lora, adapter_id))
        return unloaded

    async def pin_lora(self, adapter_id: str, pinned: bool = True) -> None:
        await asyncio.wrap_future(self._call(self.engine.pin_lora, adapter_id, pinned))

    async def list_loras(self) -> list[dict[str, Any]]:
        return self.engine.list_loras()  # a read under the LoRA manager's lock

    def _call(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        with self._lock:
            if self._stopped:
                raise self._refusal()
            self._calls.add(future)
            self._send(("call", (fn, args, future)))
        future.add_done_callback(self._call_answered)
        return future

    def _call_answered(self, future: Future[Any]) -> None:
        with self._lock:
            self._calls.discard(future)

    def shutdown(self, timeout: float | None = 10.0) -> None:
        """Stop the step thread; streams still open end with finish_reason "abort"."""
        with self._lock:
            self._stopped = True
        self._wakeup.set()
        self._thread.join(timeout)
        self.engine.close()

    def _refusal(self) -> EngineStoppedError:
        if self.failure is not None:
            return EngineDeadError(
                f"the engine failed ({type(self.failure).__name__}) and takes no new requests "
                f"until its process is restarted"
            )
        return EngineStoppedError("the engine is shut down and takes no new requests")

    def _stream_closed(self, request_id: str) -> None:
        with self._lock:
            self._streams.pop(request_id, None)
        self._send(("abort", request_id))

    def _send(self, command: Command) -> None:
        self._commands.put(command)
        self._wakeup.set()

    # -- the step thread --------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        except Exception as e:
            logger.exception("the engine's step loop failed; failing every request it holds")
            self._die(e)

    def _loop(self) -> None:
        idle = None  # seconds to wait for a wakeup; None: until a command or load arrives
        while True:
            self._wakeup.wait(idle)
            self._wakeup.clear()
            with self._lock:
                stopped = self._stopped
            self._apply_commands()
            if stopped:
                for request_id in list(self.engine.requests):
                    self.engine.abort(request_id)
                self._deliver_all(self.engine.step())
                self._fail_calls()
                return
            idle = None
            if not self.engine.has_unfinished():
                continue
            steps = self.engine.num_steps
            outputs = self.engine.step()
            self._deliver_all(outputs)
            if not outputs and self.engine.num_steps == steps:
                # Nothing could run: requests wait for adapter loads, whose end (or a new
                # command) sets the wakeup. The timeout only guards against a missed one.
                idle = 0.1
            else:
                self._wakeup.set()  # keep stepping while work remains

    def _apply_commands(self) -> None:
        for command, arg in drain(self._commands):
            if command == "add":
                self._add(arg)
            elif command == "call":
                _run_call(arg)
            else:
                self.engine.abort(arg)

    def _add(self, seq: Sequence) -> None:
        try:
            self.engine.add_sequence(seq)
        except EngineError as e:
            self._deliver(seq.request_id, e)

    def _fail_calls(self) -> None:
        """After shutdown: calls still queued or unanswered (a load in progress) get an
        error instead of waiting forever."""
        for _ in drain(self._commands):
            pass  # every queued call's future is in _calls
        with self._lock:
            calls, self._calls = list(self._calls), set()
        for future in calls:
            _set_exception(future, EngineStoppedError("the engine is shut down"))

    def _die(self, error: Exception) -> None:
        """The step loop raised: refuse new work, fail every stream and control still
        waiting (those queued and not yet added too), and tell the owner."""
        with self._lock:
            self._stopped = True
            self.failure = error
            streams, self._streams = list(self._streams.values()), {}
            calls, self._calls = list(self._calls), set()
        for stream in streams:
            with suppress(RuntimeError):  # the caller's event loop is closed
                stream.put(_dead(error))
        for future in calls:
            _set_exception(future, _dead(error))
        if self._on_failure is not None:
            self._on_failure(error)

    def _deliver_all(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            # a request that could not be served (its adapter failed to load) raises
            self._deliver(out.request_id, out if out.error is None else out.error)

    def _deliver(self, request_id: str, item: StreamItem) -> None:
        with self._lock:
            stream = self._streams.get(request_id)
            if stream is not None and (isinstance(item, BaseException) or item.finished):
                del self._streams[request_id]
        if stream is None:
            return  # the caller has gone; its abort is queued
        try:
            stream.put(item)
        except RuntimeError:  # the caller's event loop is closed
            self.engine.abort(request_id)


def _dead(error: Exception) -> EngineDeadError:
    return EngineDeadError(
        f"the engine failed ({type(error).__name__}) and stopped before this request finished; "
        f"it takes no more requests until its process is restarted"
    )


def _set_exception(future: Future[Any], error: Exception) -> None:
    with suppress(InvalidStateError):  # answered meanwhile (a loader thread resolved it)
        future.set_exception(error)


def _run_call(call: Call) -> None:
    """Run a LoRA control on the step thread and answer its caller's future; a control that
    returns a future (load_lora) answers once that one resolves, at a later step."""
    fn, args, future = call
    try:
        result = fn(*args)
    except Exception as e:
        future.set_exception(e)
        return
    if isinstance(result, Future):
        _chain(result, future)
    else:
        future.set_result(result)


def _chain(source: Future[Any], target: Future[Any]) -> None:
    def copy(done: Future[Any]) -> None:
        if done.cancelled():
            target.cancel()
        elif (error := done.exception()) is not None:
            target.set_exception(error)
        else:
            target.set_result(done.result())

    source.add_done_callback(copy)
