"""A response's size in bytes, known before a token is generated: one that would pass
LORAPLEX_MAX_RESPONSE_BYTES is refused with a 400 naming the parameter to lower.

The logprob entry count (generation.refuse_oversized_answer) bounds how many entries an
answer holds, not how long its texts are: `echo` with `n` repeats each prompt's text in
every choice, so a 786 KB body of token ids (16 prompts of 8,191 copies of an 81-character
token, `n: 16`) made a 172 MB answer with no logprobs at all. Here every part of the body is
counted in bytes of the JSON the server writes (json.dumps, ASCII-escaped: `é` is six
bytes, `\\u00e9`):

- the echoed prompt text, exact: it is decoded before generation (echo.py), once per
  returned choice;
- generated text, at most `max_tokens` x (the vocabulary's longest token + 1) per choice:
  the longest token is measured once per tokenizer, each token decoded alone and escaped as
  the answer escapes it (a text decodes to no more than its tokens alone do: a character
  split across tokens is a replacement character in each; the + 1 is the leading space a
  tokenizer drops from a text's first token). A bound, not a guess: logit_bias or an
  adapter can make every token the longest;
- logprob entries, each its token's text (exact for an echoed prompt token, the longest
  token for a generated one and for every `top` alternative, which the model picks) and
  its numbers at their longest (a float is at most 24 characters);
- fixed parts: each choice's keys and `finish_reason`, the envelope and usage.

`best_of`'s candidates are all generated and held until the best `n` are picked, so their
generated text and logprobs count; what each returns (its echo) counts once per returned
choice. A stream carries the same texts and entries in chunks whose envelopes (some 150
bytes and the model's name per chunk) are not counted: they are written as the tokens come,
never held together, and their number is bounded by the tokens. Tool calls are counted as
the text they are parsed from.
"""

import json
import threading
import weakref
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.conf import settings

from inference.errors import ProtocolError

from .echo import EchoedPrompt
from .protocol import GenerationRequest

if TYPE_CHECKING:
    from inference.engine.tokenizer import Tokenizer

FLOAT = 24  # the longest repr of a float: -2.2250738585072014e-308
INT = 10  # a text offset or a rank, within 2**31
# JSON around one logprob entry with its separators (a list item or a dict item); the
# chat and vLLM entries carry key names too.
LEGACY_ENTRY = 4 + (FLOAT + 2) + 4 + (INT + 2)  # "tok", float, {...}, offset
LEGACY_TOP = 6 + FLOAT  # "tok": float,
CHAT_ENTRY = 70 + FLOAT  # {"token": "", "logprob": , "bytes": [], "top_logprobs": []},
CHAT_BYTES_PER_CHAR = 5  # "bytes": one "255, " per UTF-8 byte, never more bytes than escaped
PROMPT_ENTRY = 60 + FLOAT + 2 * INT  # "id": {"logprob": , "rank": , "decoded_token": ""},
CHOICE = 200  # one choice's keys, index, finish_reason, role, the nulls
ENVELOPE = 400  # id, object, created, model's keys, usage


@dataclass(frozen=True)
class TokenSizes:
    """Each token's text alone (special tokens written out), in bytes as the answer escapes it."""

    rendered: array  # token id -> its bytes
    longest: int


_sizes: "weakref.WeakKeyDictionary[Tokenizer, TokenSizes]" = weakref.WeakKeyDictionary()
_sizes_lock = threading.Lock()


def token_sizes(tokenizer: "Tokenizer") -> TokenSizes:
    """Measured once per tokenizer (a quarter of a second for 150,000 tokens), off the loop."""
    with _sizes_lock:
        sizes = _sizes.get(tokenizer)
        if sizes is None:
            rendered = array(
                "I",
                (
                    _escaped(tokenizer.decode([token_id], skip_special_tokens=False))
                    for token_id in range(tokenizer.vocab_size)
                ),
            )
            sizes = TokenSizes(rendered, max(rendered, default=1))
            _sizes[tokenizer] = sizes
        return sizes


def _escaped(text: str) -> int:
    """Bytes of `text` in a JSON string as json.dumps writes it, without the quotes."""
    return len(json.dumps(text)) - 2


@dataclass(frozen=True)
class _Prompt:
    tokens: int
    echo_bytes: int  # its echoed text (0 without echo)
    token_bytes: int  # its tokens' texts, each alone (an echo's logprob entries show them)
    max_tokens: int  # what each of its choices may generate


@dataclass(frozen=True)
class _Shape:
    """What the size depends on, the request's counts apart."""

    kind: str  # "chat" or "text"
    echo: bool
    generates: bool  # False: max_tokens 0 with echo, the prompt alone
    logprobs: int | None
    prompt_logprobs: int | None
    longest: int
    text_param: str  # max_tokens or max_completion_tokens
    logprobs_param: str  # logprobs or top_logprobs


@dataclass(frozen=True)
class Estimate:
    parts: dict[str, int]  # bytes by the parameter that asks for them
    total: int  # the parts and the fixed bytes around them
    param_to_lower: Callable[[int], str]  # to fit a limit of so many bytes


def estimate(
    parsed: GenerationRequest,
    kind: str,
    tokenizer: "Tokenizer",
    prompt_ids: Sequence[list[int]],
    max_tokens: Sequence[int],
    echoes: Sequence[EchoedPrompt] | None,
) -> Estimate:
    """The most bytes the answer to `parsed` can hold. `max_tokens`: each prompt's budget
    per choice; `echoes`: each prompt's, with echo."""
    sizes = token_sizes(tokenizer)
    shape = _Shape(
        kind=kind,
        echo=echoes is not None,
        generates=not (parsed.echo and parsed.max_tokens == 0),
        logprobs=parsed.logprobs,
        prompt_logprobs=parsed.prompt_logprobs,
        longest=sizes.longest,
        text_param=parsed.max_tokens_param,
        logprobs_param="top_logprobs" if kind == "chat" else "logprobs",
    )
    shows_tokens = (shape.echo and shape.logprobs is not None) or shape.prompt_logprobs is not None
    prompts = [
        _Prompt(
            tokens=len(ids),
            echo_bytes=0 if echoes is None else _escaped(echoes[i].text),
            token_bytes=sum(sizes.rendered[t] for t in ids) if shows_tokens else 0,
            max_tokens=max_tokens[i],
        )
        for i, ids in enumerate(prompt_ids)
    ]
    n, candidates = parsed.n, parsed.best_of or parsed.n
    overhead = ENVELOPE + _escaped(parsed.model)

    def total(batch: Sequence[_Prompt], n: int, candidates: int) -> int:
        parts = _parts(shape, batch, n, candidates)
        return sum(parts.values()) + overhead + len(batch) * n * CHOICE

    def param(limit: int) -> str:
        """The first of best_of, n and the batch whose lowering alone makes the answer fit
        `limit`; else the part that weighs most."""
        if candidates > n and total(prompts, n, n) <= limit:
            return "best_of"
        if n > 1 and total(prompts, 1, 1) <= limit:
            return "n"
        if len(prompts) > 1 and all(total([p], n, candidates) <= limit for p in prompts):
            return "prompt"
        return max(parts, key=lambda name: parts[name])

    parts = _parts(shape, prompts, n, candidates)
    return Estimate(parts, total(prompts, n, candidates), param)


def refuse_oversized_response(
    parsed: GenerationRequest,
    kind: str,
    tokenizer: "Tokenizer",
    prompt_ids: Sequence[list[int]],
    max_tokens: Sequence[int],
    echoes: Sequence[EchoedPrompt] | None,
) -> None:
    """Refuse, before generation, an answer past LORAPLEX_MAX_RESPONSE_BYTES (0: off)."""
    limit = settings.MAX_RESPONSE_BYTES
    if not limit:
        return
    size = estimate(parsed, kind, tokenizer, prompt_ids, max_tokens, echoes)
    if size.total <= limit:
        return
    param = size.param_to_lower(limit)
    named = ", ".join(f"{name} {part:,}" for name, part in size.parts.items() if part)
    batch = f"{len(prompt_ids)} prompts x " if len(prompt_ids) > 1 else ""
    raise ProtocolError(
        f"The response would hold up to {size.total:,} bytes ({named or 'envelopes'}; "
        f"{batch}{parsed.n} choices), more than this server's {limit:,} "
        f"(LORAPLEX_MAX_RESPONSE_BYTES). Lower {param}{_HOW.get(param, '')}.",
        param=param,
    )


_HOW = {
    "prompt": " (fewer prompts per request)",
    "echo": " (echo: false, or a shorter prompt)",
}


def _parts(shape: _Shape, prompts: Sequence[_Prompt], n: int, candidates: int) -> dict[str, int]:
    """Bytes by the parameter that asks for them, over the whole answer."""
    longest = shape.longest
    echo = text = logprobs = prompt_logprobs = 0
    for p in prompts:
        generated = p.max_tokens if shape.generates else 0
        echo += n * p.echo_bytes
        text += candidates * generated * (longest + 1)
        if shape.logprobs is not None:
            top = shape.logprobs
            if shape.kind == "chat":
                per_token = (1 + top) * (CHAT_ENTRY + (1 + CHAT_BYTES_PER_CHAR) * longest)
                logprobs += candidates * generated * per_token
            else:
                per_token = LEGACY_ENTRY + top * (LEGACY_TOP + longest)
                logprobs += candidates * generated * (per_token + longest)
                if shape.echo:
                    logprobs += n * (p.tokens * per_token + p.token_bytes)
        if shape.prompt_logprobs is not None:
            k = shape.prompt_logprobs
            per_prompt = p.tokens * (1 + k) * PROMPT_ENTRY + p.token_bytes + p.tokens * k * longest
            # a completion repeats them in every choice; a chat answer holds them once
            prompt_logprobs += per_prompt * (n if shape.kind == "text" else 1)
    return {
        "echo": echo,
        shape.text_param: text,
        shape.logprobs_param: logprobs,
        "prompt_logprobs": prompt_logprobs,
    }
