"""What callers get back, and the rules that turn a sampled token into it: detokenizing,
stop tokens, stop strings (held back while they could still be forming), length limits."""

from dataclasses import dataclass, field

from .logprobs import TokenLogprob
from .sequence import Sequence


@dataclass
class RequestOutput:
    """What one step added to one request. A stream is the concatenation of these."""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    new_logprobs: list[TokenLogprob]
    finished: bool
    finish_reason: str | None  # "stop", "length" or "abort" once finished
    prompt_tokens: int
    completion_tokens: int
    # with SamplingParams.prompt_logprobs: one entry per prompt token (None for the first,
    # which has no context), on the request's first output only
    prompt_logprobs: list[TokenLogprob | None] | None = None
    # why an aborted request could not be served (e.g. an AdapterLoadError); the async
    # front raises it to the caller instead of handing over this output
    error: Exception | None = None


@dataclass
class CompletionOutput:
    """A whole finished request, as `LLMEngine.generate` returns it."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob | None] | None = None
    finish_reason: str | None = None
    error: Exception | None = None


def append_token(
    seq: Sequence,
    token_id: int,
    logprob: TokenLogprob | None,
    *,
    eos_token_ids: frozenset[int],
    max_len: int,
    complete: bool = False,
) -> RequestOutput:
    """Add a sampled token to the sequence, decide whether it finished, and say what the
    caller may see now. Sets `seq.finish_reason`; the caller frees the sequence.
    `complete`: the token completed the sequence's structured output, so it stops."""
    params = seq.params
    seq.token_ids.append(token_id)
    seen = len(seq.text)
    if token_id in params.stop_token_ids or (not params.ignore_eos and token_id in eos_token_ids):
        seq.finish_reason = "stop"  # the stop token is counted; its text only if asked for
        if params.include_stop_str_in_output:
            seq.text += seq.detokenizer.push(token_id)
    else:
        seq.text += seq.detokenizer.push(token_id)
        if complete:
            seq.finish_reason = "stop"
        elif seq.num_completion_tokens >= params.max_tokens or len(seq) >= max_len:
            seq.finish_reason = "length"
    if seq.finish_reason is not None:
        seq.text += seq.detokenizer.flush()
    if params.stop and seq.num_completion_tokens > params.min_tokens:  # none in the first ones
        _truncate_at_stop_string(seq, seen)
    if seq.finish_reason is None:
        hold = max((len(s) for s in params.stop), default=1) - 1
        visible = max(seq.num_text_sent, len(seq.text) - hold)
    else:
        visible = len(seq.text)
    new_text = seq.text[seq.num_text_sent : visible]
    seq.num_text_sent = visible
    first = seq.num_completion_tokens == 1 and params.prompt_logprobs is not None
    return RequestOutput(
        request_id=seq.request_id,
        new_token_ids=[token_id],
        new_text=new_text,
        new_logprobs=[logprob] if logprob is not None else [],
        finished=seq.finish_reason is not None,
        finish_reason=seq.finish_reason,
        prompt_tokens=seq.num_prompt_tokens,
        completion_tokens=seq.num_completion_tokens,
        prompt_logprobs=(seq.prompt_logprobs or [None]) if first else None,
    )


def _truncate_at_stop_string(seq: Sequence, seen: int) -> None:
    """Cut the text at the earliest stop string that ends in the newly added text (after
    it with include_stop_str_in_output)."""
    stops = seq.params.stop
    longest = max(len(s) for s in stops)
    start = max(0, seen - longest + 1)
    hits = [(i, len(s)) for s in stops if (i := seq.text.find(s, start)) >= 0]
    if hits:
        at, length = min(hits)
        seq.text = seq.text[: at + length if seq.params.include_stop_str_in_output else at]
        seq.finish_reason = "stop"


def abort_output(seq: Sequence, error: Exception | None = None) -> RequestOutput:
    return RequestOutput(
        request_id=seq.request_id,
        new_token_ids=[],
        new_text="",
        new_logprobs=[],
        finished=True,
        finish_reason="abort",
        prompt_tokens=seq.num_prompt_tokens,
        completion_tokens=seq.num_completion_tokens,
        error=error,
    )
