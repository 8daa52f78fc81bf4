"""Building OpenAI-shaped response bodies and stream chunks from engine outputs.

One accumulator per request (`CompletionBuilder`) sees every engine delta; it renders
either one final body or, chunk by chunk, a server-sent-event stream.
"""

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field


def sse(payload) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


SSE_DONE = sse("[DONE]")


@dataclass
class CompletionBuilder:
    """Accumulates one request's deltas. `kind` is "chat" or "text" (the /v1/completions API)."""

    kind: str
    model: str
    decode_token: Callable[[int], str]  # token id -> its text, for logprob entries
    logprobs: int | None = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))
    text: str = ""
    token_logprobs: list = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def object_id(self) -> str:
        return ("chatcmpl-" if self.kind == "chat" else "cmpl-") + self.id

    def add(self, output) -> dict | None:
        """Take one engine delta; return the stream chunk for it (None when it adds nothing)."""
        self.text += output.new_text
        self.prompt_tokens, self.completion_tokens = output.prompt_tokens, output.completion_tokens
        entries = (
            [self._logprob_entry(lp) for lp in output.new_logprobs]
            if self.logprobs is not None
            else []
        )
        self.token_logprobs += entries
        if output.finished:
            self.finish_reason = output.finish_reason  # "stop", "length", or "abort" (shutdown)
        if not output.new_text and not output.finished and not entries:
            return None
        return self._chunk(
            output.new_text, entries, self.finish_reason if output.finished else None
        )

    def first_chunk(self) -> dict:
        """Chat streams open with the assistant role, as OpenAI's do."""
        return self._envelope(
            "chat.completion.chunk",
            [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
        )

    def usage(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }

    def usage_chunk(self) -> dict:
        kind = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {**self._envelope(kind, []), "usage": self.usage()}

    def final_body(self) -> dict:
        if self.kind == "chat":
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": self.text},
                "logprobs": {"content": self.token_logprobs} if self.logprobs is not None else None,
                "finish_reason": self.finish_reason,
            }
            return {**self._envelope("chat.completion", [choice]), "usage": self.usage()}
        choice = {
            "index": 0,
            "text": self.text,
            "logprobs": self._text_logprobs(self.token_logprobs),
            "finish_reason": self.finish_reason,
        }
        return {**self._envelope("text_completion", [choice]), "usage": self.usage()}

    def _chunk(self, text: str, entries: list, finish_reason) -> dict:
        if self.kind == "chat":
            choice = {
                "index": 0,
                "delta": {"content": text} if text else {},
                "logprobs": {"content": entries} if self.logprobs is not None else None,
                "finish_reason": finish_reason,
            }
            return self._envelope("chat.completion.chunk", [choice])
        choice = {
            "index": 0,
            "text": text,
            "logprobs": self._text_logprobs(entries),
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

    def _text_logprobs(self, entries: list) -> dict | None:
        """The legacy completions API has its own parallel-list layout."""
        if self.logprobs is None:
            return None
        return {
            "tokens": [e["token"] for e in entries],
            "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [
                {t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries
            ],
            "text_offset": [],
        }
