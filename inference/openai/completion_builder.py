"""Building OpenAI-shaped response bodies and stream chunks from engine outputs.

One accumulator per request (`CompletionBuilder`) sees every engine delta of each of its
`n` choices; it renders either one final body or, chunk by chunk, a server-sent-event
stream whose chunks carry their choice's `index`.
"""

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from .tool_calls import CallReader, Delta, call_reader
from .tools import ToolUse


def sse(payload) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


SSE_DONE = sse("[DONE]")


# JSON has no infinity: a token the model rules out gets vLLM's stand-in for its logprob.
MIN_LOGPROB = -9999.0


@dataclass
class Choice:
    """What one choice (one engine request) has produced so far."""

    index: int
    text: str = ""
    token_logprobs: list = field(default_factory=list)
    text_offsets: list[int] = field(default_factory=list)  # where each token starts in `text`
    finish_reason: str | None = None
    completion_tokens: int = 0
    calls: CallReader | None = None  # with tools: reads the tool calls out of `text`


@dataclass
class CompletionBuilder:
    """Accumulates one request's deltas, for each of its `n` choices. `kind` is "chat" or
    "text" (the /v1/completions API)."""

    kind: str
    model: str
    decode_token: Callable[[int], str]  # token id -> its text, for logprob entries
    logprobs: int | None = None
    n: int = 1
    prompt_logprobs: int | None = None  # None: not asked for; k: the top k at each position
    tool_use: ToolUse | None = None  # chat with tools: each choice's answer may hold calls
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))
    prompt_tokens: int = 0
    prompt_logprob_entries: list[dict | None] | None = None  # vLLM's shape, from choice 0
    choices: list[Choice] = field(init=False)

    def __post_init__(self) -> None:
        self.choices = [Choice(index=i, calls=call_reader(self.tool_use)) for i in range(self.n)]

    @property
    def object_id(self) -> str:
        return ("chatcmpl-" if self.kind == "chat" else "cmpl-") + self.id

    @property
    def completion_tokens(self) -> int:
        return sum(choice.completion_tokens for choice in self.choices)

    @property
    def aborted(self) -> bool:
        """Whether a choice ended unfinished (the engine shut down under it)."""
        return any(choice.finish_reason == "abort" for choice in self.choices)

    def add(self, index: int, output) -> dict | None:
        """Take one engine delta of choice `index`; return the stream chunk for it (None when
        it adds nothing)."""
        choice = self.choices[index]
        choice.text += output.new_text
        self.prompt_tokens = output.prompt_tokens
        choice.completion_tokens = output.completion_tokens
        if self.prompt_logprobs is not None and output.prompt_logprobs is not None:
            self.prompt_logprob_entries = [
                self._prompt_logprob_entry(lp) for lp in output.prompt_logprobs
            ]
        entries = (
            [self._logprob_entry(lp) for lp in output.new_logprobs]
            if self.logprobs is not None
            else []
        )
        choice.token_logprobs += entries
        choice.text_offsets += _offsets(len(choice.text) - len(output.new_text), entries)
        delta = Delta(content=output.new_text)
        if choice.calls is not None:
            delta = choice.calls.feed(output.new_text)
            if output.finished:
                delta += choice.calls.finish()
        if output.finished:  # "stop", "length", "abort" (shutdown); "tool_calls"
            choice.finish_reason = output.finish_reason
            if choice.calls is not None:
                choice.finish_reason = choice.calls.finish_reason(output.finish_reason)
        if not (delta.content or delta.tool_calls or output.finished or entries):
            return None
        return self._chunk(
            index,
            delta.content,
            entries,
            choice.finish_reason if output.finished else None,
            delta.tool_calls,
        )

    def first_chunks(self) -> list[dict]:
        """Chat streams open with the assistant role, one chunk per choice, as OpenAI's do."""
        return [
            self._envelope(
                "chat.completion.chunk",
                [
                    {
                        "index": choice.index,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
            )
            for choice in self.choices
        ]

    def usage(self) -> dict:
        """The prompt counts once, however many choices share it."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }

    def usage_chunk(self) -> dict:
        kind = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {**self._envelope(kind, []), "usage": self.usage()}

    def final_body(self) -> dict:
        kind = "chat.completion" if self.kind == "chat" else "text_completion"
        choices = [self._final_choice(c) for c in self.choices]
        body = {**self._envelope(kind, choices), "usage": self.usage()}
        if self.kind == "chat" and self.prompt_logprobs is not None:
            body["prompt_logprobs"] = self.prompt_logprob_entries  # vLLM: once, beside choices
        return body

    def _final_choice(self, c: Choice) -> dict:
        if self.kind == "chat":
            message: dict = {"role": "assistant", "content": c.text, "refusal": None}
            if c.calls is not None:
                message["content"] = c.calls.content
                if c.calls.calls:
                    message["tool_calls"] = c.calls.calls
            return {
                "index": c.index,
                "message": message,
                "logprobs": self._chat_logprobs(c.token_logprobs),
                "finish_reason": c.finish_reason,
            }
        choice = {
            "index": c.index,
            "text": c.text,
            "logprobs": self._text_logprobs(c.token_logprobs, c.text_offsets),
            "finish_reason": c.finish_reason,
        }
        if self.prompt_logprobs is not None:  # vLLM: in each choice of a completion
            choice["prompt_logprobs"] = self.prompt_logprob_entries
        return choice

    def _chunk(
        self, index: int, text: str, entries: list, finish_reason, tool_calls: list | None = None
    ) -> dict:
        if self.kind == "chat":
            delta: dict = {"content": text} if text else {}
            if tool_calls:
                delta["tool_calls"] = tool_calls
            choice = {
                "index": index,
                "delta": delta,
                "logprobs": self._chat_logprobs(entries),
                "finish_reason": finish_reason,
            }
            return self._envelope("chat.completion.chunk", [choice])
        choice = {
            "index": index,
            "text": text,
            "logprobs": self._text_logprobs(entries, self._last_offsets(index, len(entries))),
            "finish_reason": finish_reason,
        }
        return self._envelope("text_completion", [choice])

    def _envelope(self, obj: str, choices: list) -> dict:
        return {
            "id": self.object_id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def _logprob_entry(self, lp) -> dict:
        token = self.decode_token(lp.token_id)
        return {
            "token": token,
            "logprob": lp.logprob,
            "bytes": list(token.encode()),
            "top_logprobs": [
                {
                    "token": (t := self.decode_token(tid)),
                    "logprob": value,
                    "bytes": list(t.encode()),
                }
                for tid, value in lp.top[: self.logprobs]
            ],
        }

    def _prompt_logprob_entry(self, lp) -> dict | None:
        """vLLM's shape: None for the first prompt token (it has no context), else the prompt
        token and the k most likely ones there, keyed by token id (a JSON string key)."""
        if lp is None:
            return None
        ranked = [(lp.token_id, lp.logprob, lp.rank)]
        ranked += [(tid, value, rank) for rank, (tid, value) in enumerate(lp.top, 1)]
        entry: dict[str, dict] = {}
        for tid, value, rank in ranked[: 1 + (self.prompt_logprobs or 0)]:
            entry.setdefault(
                str(tid),
                {
                    "logprob": max(value, MIN_LOGPROB),
                    "rank": rank,
                    "decoded_token": self.decode_token(tid),
                },
            )
        return entry

    def _last_offsets(self, index: int, count: int) -> list[int]:
        """The offsets of choice `index`'s latest `count` tokens, those of a stream chunk."""
        return self.choices[index].text_offsets[-count:] if count else []

    def _chat_logprobs(self, entries: list) -> dict | None:
        """OpenAI's shape: `refusal` holds a refusal's tokens; this server never refuses so."""
        return {"content": entries, "refusal": None} if self.logprobs is not None else None

    def _text_logprobs(self, entries: list, offsets: list[int]) -> dict | None:
        """The legacy completions API has its own parallel-list layout."""
        if self.logprobs is None:
            return None
        return {
            "tokens": [e["token"] for e in entries],
            "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [
                {t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries
            ],
            "text_offset": offsets,
        }


def _offsets(start: int, entries: list) -> list[int]:
    """Each token's start in the choice's text: its delta's text begins at `start`, and the
    delta's tokens follow one another (a token held back from the text, as the start of a
    possible stop string, still gets a place)."""
    offsets = []
    for entry in entries:
        offsets.append(start)
        start += len(entry["token"])
    return offsets
