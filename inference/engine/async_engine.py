"""AsyncLLMEngine: many asyncio callers, one engine, one step thread.

Only the step thread touches the LLMEngine's state. Callers validate their request in
their own thread (errors raise at once), then hand the ready Sequence over through a
command queue; outputs go back to each caller's event loop with `call_soon_threadsafe`.
A caller that stops listening (cancelled, closed or dropped its stream) aborts its request.
The LoRA controls (load, unload, pin) are coroutines whose work travels the same queue, so
they take effect between steps, never in the middle of one.
"""

import asyncio
import logging
import queue
import threading
from concurrent.futures import Future

from .errors import DuplicateRequestError, EngineError
from .llm_engine import LLMEngine
from .lora import LoRARequest
from .outputs import RequestOutput
from .sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class EngineStoppedError(EngineError):
    """The engine was shut down; no new requests are taken."""


class RequestStream:
    """The deltas of one request, as an async iterator. Ends after the output whose
    `finished` is set; stopping early (cancel, `aclose()`, or dropping it) aborts the request."""

    def __init__(self, owner: "AsyncLLMEngine", request_id: str, loop: asyncio.AbstractEventLoop):
        self.request_id = request_id
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()  # RequestOutput, or an exception to raise
        self._owner = owner
        self._done = False

    def __aiter__(self):
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

    async def aclose(self):
        self._stop()

    def __del__(self):
        self._stop()

    def _stop(self):
        if not self._done:
            self._done = True
            self._owner._stream_closed(self.request_id)


class AsyncLLMEngine:
    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wakeup = threading.Event()
        self._lock = threading.Lock()  # guards _streams and _stopped
        self._streams: dict[str, RequestStream] = {}
        self._stopped = False
        if engine.lora_manager is not None:
            engine.lora_manager.loader.wakeup = self._wakeup.set  # a finished load may unblock
        self._thread = threading.Thread(target=self._run, name="loraplex-engine-step", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, config=None, **kwargs) -> "AsyncLLMEngine":
        return cls(LLMEngine(config, **kwargs))

    def generate(
        self,
        request_id: str,
        prompt: str | None = None,
        sampling_params: SamplingParams | None = None,
        *,
        prompt_token_ids: list[int] | None = None,
        lora_request: LoRARequest | None = None,
        fairness_key: str | None = None,
    ) -> RequestStream:
        """Queue a request and return its stream of deltas. Call it from a coroutine; a bad
        request raises here, before anything is queued. If its adapter cannot be loaded, the
        stream raises AdapterLoadError (whose message names the failed checks)."""
        loop = asyncio.get_running_loop()
        seq = self.engine.make_sequence(
            request_id,
            prompt,
            sampling_params,
            prompt_token_ids=prompt_token_ids,
            lora_request=lora_request,
            fairness_key=fairness_key,
        )
        stream = RequestStream(self, request_id, loop)
        with self._lock:
            if self._stopped:
                stream._done = True
                raise EngineStoppedError("the engine is shut down and takes no new requests")
            if request_id in self._streams:
                stream._done = True
                raise DuplicateRequestError(
                    f"request id {request_id!r} is already in use; give each request a unique id"
                )
            self._streams[request_id] = stream
            self._send("add", seq)  # under the lock, so shutdown cannot miss it
        return stream

    def abort(self, request_id: str):
        """Stop a request; its stream, if still read, ends with finish_reason "abort"."""
        self._send("abort", request_id)

    def stats(self) -> dict:
        return self.engine.stats()

    def is_alive(self) -> bool:
        """Whether the step thread is running (false once shut down or if it died)."""
        return self._thread.is_alive() and not self._stopped

    # -- LoRA controls: run on the step thread, between steps --------------------------------

    async def load_lora(self, lora_request: LoRARequest, pin: bool = False) -> None:
        """Bring an adapter into host memory (and, with `pin`, keep it in a device slot).
        Returns once it is loaded; raises AdapterLoadError naming the failed checks."""
        self.engine._check_lora_request(lora_request)
        await asyncio.wrap_future(self._call(self.engine.load_lora, lora_request, pin))

    async def unload_lora(self, adapter_id: str) -> bool:
        """True if the adapter was known and is now dropped; refused while requests use it."""
        return await asyncio.wrap_future(self._call(self.engine.unload_lora, adapter_id))

    async def pin_lora(self, adapter_id: str, pinned: bool = True) -> None:
        await asyncio.wrap_future(self._call(self.engine.pin_lora, adapter_id, pinned))

    async def list_loras(self) -> list[dict]:
        return self.engine.list_loras()  # a read under the LoRA manager's lock

    def _call(self, fn, *args) -> Future:
        future: Future = Future()
        with self._lock:
            if self._stopped:
                raise EngineStoppedError("the engine is shut down")
            self._send("call", (fn, args, future))
        return future

    def shutdown(self, timeout: float | None = 10.0):
        """Stop the step thread; streams still open end with finish_reason "abort"."""
        with self._lock:
            self._stopped = True
        self._wakeup.set()
        self._thread.join(timeout)
        self.engine.close()

    def _stream_closed(self, request_id: str):
        with self._lock:
            self._streams.pop(request_id, None)
        self._send("abort", request_id)

    def _send(self, command: str, arg):
        self._commands.put((command, arg))
        self._wakeup.set()

    # -- the step thread --------------------------------------------------------------------

    def _run(self):
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
            in_flight = list(self.engine.requests)
            try:
                outputs = self.engine.step()
            except Exception as e:  # a failing step must not leave callers waiting forever
                logger.exception("engine step failed; failing the requests in flight")
                self._fail(in_flight, e)
                outputs = None
            else:
                self._deliver_all(outputs)
            if outputs == []:
                # Nothing could run: requests wait for adapter loads, whose end (or a new
                # command) sets the wakeup. The timeout only guards against a missed one.
                idle = 0.1
            else:
                self._wakeup.set()  # keep stepping while work remains

    def _apply_commands(self):
        while True:
            try:
                command, arg = self._commands.get_nowait()
            except queue.Empty:
                return
            if command == "add":
                try:
                    self.engine.add_sequence(arg)
                except EngineError as e:
                    self._deliver(arg.request_id, e)
            elif command == "call":
                fn, args, future = arg
                try:
                    result = fn(*args)
                except Exception as e:
                    future.set_exception(e)
                    continue
                if isinstance(result, Future):  # load_lora: resolved by a later step
                    _chain(result, future)
                else:
                    future.set_result(result)
            else:
                self.engine.abort(arg)

    def _fail_calls(self):
        """After shutdown: calls still queued get an error instead of waiting forever."""
        while True:
            try:
                command, arg = self._commands.get_nowait()
            except queue.Empty:
                return
            if command == "call":
                arg[2].set_exception(EngineStoppedError("the engine is shut down"))

    def _deliver_all(self, outputs: list[RequestOutput]):
        for out in outputs:
            # a request that could not be served (its adapter failed to load) raises
            self._deliver(out.request_id, out if out.error is None else out.error)

    def _deliver(self, request_id: str, item):
        with self._lock:
            stream = self._streams.get(request_id)
            if stream is not None and (isinstance(item, BaseException) or item.finished):
                del self._streams[request_id]
        if stream is None:
            return  # the caller has gone; its abort is queued
        try:
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, item)
        except RuntimeError:  # the caller's event loop is closed
            self.engine.abort(request_id)

    def _fail(self, request_ids: list[str], error: Exception):
        for request_id in request_ids:
            self.engine.abort(request_id)
        self.engine.step()  # drains the abort outputs; nothing is left to run
        for request_id in request_ids:
            self._deliver(
                request_id, RuntimeError(f"the engine failed while serving this request: {error!r}")
            )


def _chain(source: Future, target: Future):
    def copy(done: Future):
        if done.cancelled():
            target.cancel()
        elif done.exception() is not None:
            target.set_exception(done.exception())
        else:
            target.set_result(done.result())

    source.add_done_callback(copy)
