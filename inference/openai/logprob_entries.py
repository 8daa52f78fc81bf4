"""Logprobs as the answers show them: the engine's `TokenLogprob`s rendered into OpenAI's
chat entries, the completions API's legacy parallel lists, and vLLM's `prompt_logprobs`.

JSON has no infinity: a token the model rules out gets vLLM's stand-in for its logprob.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inference.engine import TokenLogprob

MIN_LOGPROB = -9999.0


@dataclass(frozen=True)
class LogprobEntries:
    decode_token: Callable[[int], str]  # token id -> its text

    def token(self, lp: "TokenLogprob", top: int) -> dict:
        """A generated token: OpenAI's chat entry, with the `top` most likely there."""
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
                for tid, value in lp.top[:top]
            ],
        }

    def echoed(
        self, token_ids: Sequence[int], lps: Sequence["TokenLogprob | None"], top: int
    ) -> list[dict]:
        """The prompt's tokens, for an echo: each one's logprob and the `top` most likely
        there, both None for the first (it has no context) and where `lps` has no entry (a
        request aborted before its first token)."""
        entries = []
        for i, token_id in enumerate(token_ids):
            lp = lps[i] if i < len(lps) else None
            entry: dict = {"token": self.decode_token(token_id), "logprob": None}
            entry["top_logprobs"] = None
            if lp is not None:
                entry["logprob"] = max(lp.logprob, MIN_LOGPROB)
                entry["top_logprobs"] = [
                    {"token": self.decode_token(tid), "logprob": max(value, MIN_LOGPROB)}
                    for tid, value in lp.top[:top]
                ]
            entries.append(entry)
        return entries

    def prompt(self, lp: "TokenLogprob | None", k: int) -> dict | None:
        """vLLM's `prompt_logprobs` entry: None for the first prompt token (it has no
        context), else the prompt token and the k most likely ones there, keyed by token id
        (a JSON string key)."""
        if lp is None:
            return None
        ranked = [(lp.token_id, lp.logprob, lp.rank)]
        ranked += [(tid, value, rank) for rank, (tid, value) in enumerate(lp.top, 1)]
        entry: dict[str, dict] = {}
        for tid, value, rank in ranked[: 1 + k]:
            entry.setdefault(
                str(tid),
                {
                    "logprob": max(value, MIN_LOGPROB),
                    "rank": rank,
                    "decoded_token": self.decode_token(tid),
                },
            )
        return entry


def legacy(entries: list[dict], offsets: list[int]) -> dict:
    """The completions API's parallel lists, from entries of `LogprobEntries.token` or
    `.echoed`; `offsets`: where each token begins in the choice's text."""
    return {
        "tokens": [e["token"] for e in entries],
        "token_logprobs": [e["logprob"] for e in entries],
        "top_logprobs": [
            None
            if e["top_logprobs"] is None
            else {t["token"]: t["logprob"] for t in e["top_logprobs"]}
            for e in entries
        ],
        "text_offset": offsets,
    }


def token_offsets(start: int, entries: list[dict]) -> list[int]:
    """Each generated token's start in the choice's text: its delta's text begins at
    `start`, and the delta's tokens follow one another (a token held back from the text, as
    the start of a possible stop string, still gets a place)."""
    offsets = []
    for entry in entries:
        offsets.append(start)
        start += len(entry["token"])
    return offsets
