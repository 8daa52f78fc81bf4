"""The `n` choices of one request as one stream: the engine streams of its `n` engine
requests merged into one async iterator of `(choice index, output)`, in arrival order.

One task per engine stream forwards its outputs into a shared queue. The merged stream ends
once every choice has finished; if one raises (its adapter failed to load, the engine died),
it raises that at once and closes the others. Closing it (`close()`, from synchronous code
too), cancelling its reader or dropping it closes every engine stream, which aborts their
requests: a client that goes away frees all `n`.
"""

import asyncio
from collections.abc import Sequence
from contextlib import suppress
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inference.engine import RequestOutput, RequestStream

# What the queue carries: (index, an output), (index, the error it raised) or (index, None)
# once that choice has finished.
_Item = tuple[int, "RequestOutput | BaseException | None"]


class ChoiceStreams:
    def __init__(self, streams: Sequence["RequestStream"]):
        self.streams = list(streams)
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._tasks: list[asyncio.Task] = []
        self._running = len(self.streams)  # choices not finished yet
        self._closed = False

    def __aiter__(self) -> "ChoiceStreams":
        return self

    async def __anext__(self) -> tuple[int, "RequestOutput"]:
        if self._closed or not self._running:
            raise StopAsyncIteration
        if not self._tasks:  # started by the first read: nothing runs for an unread stream
            self._tasks = [
                asyncio.ensure_future(_forward(i, stream, self._queue))
                for i, stream in enumerate(self.streams)
            ]
        try:
            while self._running:
                index, item = await self._queue.get()
                if isinstance(item, BaseException):
                    raise item
                if item is not None:
                    return index, item
                self._running -= 1  # that choice has finished
        except BaseException:  # a choice failed, or the reader was cancelled: stop them all
            self.close()
            raise
        raise StopAsyncIteration

    def close(self) -> None:
        """Stop listening to every choice, aborting those not finished. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for task in self._tasks:
            task.cancel()
        for stream in self.streams:
            stream.close()

    def __del__(self) -> None:
        # The forwarding tasks hold the engine streams, not this object: dropped unclosed,
        # it still aborts them.
        with suppress(RuntimeError):  # its event loop is closed: the engine streams end too
            self.close()


async def _forward(index: int, stream: "RequestStream", queue: asyncio.Queue[_Item]) -> None:
    try:
        async for output in stream:
            queue.put_nowait((index, output))
    except Exception as exc:  # e.g. AdapterLoadError: the reader raises it
        queue.put_nowait((index, exc))
    else:
        queue.put_nowait((index, None))
