"""Building OpenAI-shaped response bodies and stream chunks from engine outputs.

One accumulator per request (`CompletionBuilder`) sees every engine delta of each of its
engine requests: for each prompt of a batch, `n` choices, or `best_of` candidates of which
the `n` most likely are returned (best_of.py); prompt p's choice j is choice p * n + j, as
OpenAI numbers them. It renders either one final body or, chunk by chunk, a server-sent-event
stream whose chunks carry their choice's `index`. With `echo` (echo.py) a completion's text
and logprobs begin with its prompt's.
"""

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from .best_of import best_n
from .echo import EchoedPrompt
from .logprob_entries import LogprobEntries, legacy, token_offsets
from .tool_calls import CallReader, Delta, call_reader
from .tools import ToolUse


def sse(payload) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


SSE_DONE = sse("[DONE]")


@dataclass
class Choice:
    """What one choice (one engine request) has produced so far."""

    index: int  # the candidate's: prompt p's candidate c is p * candidates + c
    prompt: int = 0  # which prompt of the batch it answers
    text: str = ""
    token_logprobs: list = field(default_factory=list)
    text_offsets: list[int] = field(default_factory=list)  # where each token starts in `text`
    finish_reason: str | None = None
    completion_tokens: int = 0
    calls: CallReader | None = None  # with tools: reads the tool calls out of `text`
    cumulative_logprob: float = 0.0  # of its generated tokens: best_of ranks by it
    begun: bool = False  # its first delta came (after its echo, if any)


@dataclass
class CompletionBuilder:
    """Accumulates one request's deltas, for each of its engine requests. `kind` is "chat"
    or "text" (the /v1/completions API)."""

    kind: str
    model: str
    decode_token: Callable[[int], str]  # token id -> its text, for logprob entries
    logprobs: int | None = None
    n: int = 1  # choices returned per prompt
    prompt_logprobs: int | None = None  # None: not asked for; k: the top k at each position
    tool_use: ToolUse | None = None  # chat with tools: each choice's answer may hold calls
    prompts: int = 1  # the prompts of a batch (completions)
    best_of: int | None = None  # candidates per prompt, the n most likely returned
    echo: list[EchoedPrompt] | None = None  # per prompt: each of its choices begins with it
    echo_only: bool = False  # max_tokens 0: the echo alone, the engine's one token dropped
    prompt_lengths: list[int] | None = None  # per prompt, until the engine says
    continuous_usage: bool = False  # vLLM's continuous_usage_stats: usage in every chunk
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))
    choices: list[Choice] = field(init=False)

    def __post_init__(self) -> None:
        k = self.candidates
        self.choices = [
            Choice(index=i, prompt=i // k, calls=call_reader(self.tool_use))
            for i in range(self.prompts * k)
        ]
        self.entries = LogprobEntries(self.decode_token)
        self._prompt_tokens = list(self.prompt_lengths or [0] * self.prompts)
        self._prompt_lps: list[list | None] = [None] * self.prompts  # first to come, per prompt
        self._echo_entries: list[list[dict] | None] = [None] * self.prompts

    @property
    def candidates(self) -> int:
        """Engine requests per prompt."""
        return self.best_of or self.n

    @property
    def object_id(self) -> str:
        return ("chatcmpl-" if self.kind == "chat" else "cmpl-") + self.id

    @property
    def prompt_tokens(self) -> int:
        """Every prompt of the batch once, however many choices share it."""
        return sum(self._prompt_tokens)

    @property
    def completion_tokens(self) -> int:
        """Every candidate's, returned or not: all were generated."""
        return sum(choice.completion_tokens for choice in self.choices)

    @property
    def aborted(self) -> bool:
        """Whether a choice ended unfinished (the engine shut down under it)."""
        return any(choice.finish_reason == "abort" for choice in self.choices)

    def add(self, index: int, output) -> dict | None:
        """Take one engine delta of choice `index`; return the stream chunk for it (None when
        it adds nothing)."""
        choice = self.choices[index]
        self._prompt_tokens[choice.prompt] = output.prompt_tokens
        if output.prompt_logprobs is not None and self._prompt_lps[choice.prompt] is None:
            self._prompt_lps[choice.prompt] = output.prompt_logprobs
        echo_text, echo_entries = self._begin(choice)
        new_text, new_logprobs = output.new_text, output.new_logprobs
        choice.cumulative_logprob += sum(lp.logprob for lp in new_logprobs)
        if self.echo_only:
            new_text, new_logprobs = "", []
        else:
            choice.completion_tokens = output.completion_tokens
        entries = (
            [self.entries.token(lp, self.logprobs) for lp in new_logprobs]
            if self.logprobs is not None
            else []
        )
        choice.text_offsets += token_offsets(len(choice.text), entries)
        choice.text += new_text
        choice.token_logprobs += entries
        delta = Delta(content=new_text)
        if choice.calls is not None:
            delta = choice.calls.feed(new_text)
            if output.finished:
                delta += choice.calls.finish()
        if output.finished:  # "stop", "length", "abort" (shutdown); "tool_calls"
            choice.finish_reason = output.finish_reason
            if self.echo_only and output.finish_reason != "abort":
                choice.finish_reason = "length"  # no token asked for, none returned
            if choice.calls is not None:
                choice.finish_reason = choice.calls.finish_reason(output.finish_reason)
        content, entries = echo_text + delta.content, echo_entries + entries
        if not (content or delta.tool_calls or output.finished or entries):
            return None
        return self._chunk(
            index,
            content,
            entries,
            choice.finish_reason if output.finished else None,
            delta.tool_calls,
        )

    def _begin(self, choice: Choice) -> tuple[str, list[dict]]:
        """At a choice's first delta: its echo (text and logprob entries), if any."""
        if choice.begun:
            return "", []
        choice.begun = True
        if self.echo is None:
            return "", []
        echoed = self.echo[choice.prompt]
        entries = self._echoed_entries(choice.prompt) if self.logprobs is not None else []
        choice.text = echoed.text
        choice.token_logprobs = list(entries)
        choice.text_offsets = list(echoed.offsets) if entries else []
        return echoed.text, entries

    def _echoed_entries(self, prompt: int) -> list[dict]:
        """The echoed prompt's logprob entries, rendered once per prompt for all its choices
        (once the engine has given them)."""
        cached = self._echo_entries[prompt]
        if cached is not None:
            return cached
        assert self.echo is not None and self.logprobs is not None
        lps = self._prompt_lps[prompt]
        entries = self.entries.echoed(self.echo[prompt].token_ids, lps or [], self.logprobs)
        if lps is not None:
            self._echo_entries[prompt] = entries
        return entries

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
        prompt_logprobs = self._rendered_prompt_logprobs()
        choices = [
            self._final_choice(c, index, prompt_logprobs)
            for index, c in enumerate(self._returned())
        ]
        body = {**self._envelope(kind, choices), "usage": self.usage()}
        if self.kind == "chat" and prompt_logprobs is not None:
            body["prompt_logprobs"] = prompt_logprobs[0]  # vLLM: once, beside choices
        return body

    def _returned(self) -> list[Choice]:
        """Each prompt's `n` choices, prompt after prompt: with best_of, its most likely."""
        k = self.candidates
        returned: list[Choice] = []
        for p in range(self.prompts):
            group = self.choices[p * k : (p + 1) * k]
            returned += best_n(group, self.n, lambda c: c.cumulative_logprob)
        return returned

    def _rendered_prompt_logprobs(self) -> list[list[dict | None] | None] | None:
        """vLLM's `prompt_logprobs` of each prompt (None for one the engine gave none)."""
        if self.prompt_logprobs is None:
            return None
        k = self.prompt_logprobs
        return [
            None if lps is None else [self.entries.prompt(lp, k) for lp in lps]
            for lps in self._prompt_lps
        ]

    def _final_choice(self, c: Choice, index: int, prompt_logprobs: list | None) -> dict:
        if self.kind == "chat":
            message: dict = {"role": "assistant", "content": c.text, "refusal": None}
            if c.calls is not None:
                message["content"] = c.calls.content
                if c.calls.calls:
                    message["tool_calls"] = c.calls.calls
            return {
                "index": index,
                "message": message,
                "logprobs": self._chat_logprobs(c.token_logprobs),
                "finish_reason": c.finish_reason,
            }
        choice = {
            "index": index,
            "text": c.text,
            "logprobs": self._text_logprobs(c.token_logprobs, c.text_offsets),
            "finish_reason": c.finish_reason,
        }
        if prompt_logprobs is not None:  # vLLM: in each choice of a completion
            choice["prompt_logprobs"] = prompt_logprobs[c.prompt]
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
            return self._with_usage(self._envelope("chat.completion.chunk", [choice]))
        choice = {
            "index": index,
            "text": text,
            "logprobs": self._text_logprobs(entries, self._last_offsets(index, len(entries))),
            "finish_reason": finish_reason,
        }
        return self._with_usage(self._envelope("text_completion", [choice]))

    def _with_usage(self, chunk: dict) -> dict:
        """With continuous usage, a token chunk carries the counts so far (vLLM's)."""
        return {**chunk, "usage": self.usage()} if self.continuous_usage else chunk

    def _envelope(self, obj: str, choices: list) -> dict:
        return {
            "id": self.object_id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def _last_offsets(self, index: int, count: int) -> list[int]:
        """The offsets of choice `index`'s latest `count` tokens, those of a stream chunk."""
        return self.choices[index].text_offsets[-count:] if count else []

    def _chat_logprobs(self, entries: list) -> dict | None:
        """OpenAI's shape: `refusal` holds a refusal's tokens; this server never refuses so."""
        return {"content": entries, "refusal": None} if self.logprobs is not None else None

    def _text_logprobs(self, entries: list, offsets: list[int]) -> dict | None:
        """The legacy completions API has its own parallel-list layout."""
        return legacy(entries, offsets) if self.logprobs is not None else None
