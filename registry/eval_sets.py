"""Eval sets: JSONL rows an adapter is measured on. Parsing and validation only; no Django.

The format (README, "Quality gate") is one `{"messages" | "prompt", "completion"}` object a
line. `messages` are read by the chat API's own code (inference/engine/chat_messages.py), so
a row that passes here also runs; they must not end with the assistant's turn, which is the
completion. Every refusal starts with the line number and names the field, so a person can
fix the file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from inference.engine.chat_messages import parse_messages
from inference.engine.errors import InvalidMessagesError

from .errors import InvalidEvalSet, UploadTooLarge

MAX_ROW_CHARS = 16 * 1024  # prompt (or every message's content) plus completion, per row
TOKENS_SETTING = "LORAPLEX_EVAL_MAX_TOKENS"
FIELDS = ("messages", "prompt", "completion")
_BOM = "\ufeff"


@dataclass(frozen=True)
class EvalRow:
    """One parsed row: `messages` (roles normalised as the chat API does) or `prompt`."""

    line: int
    completion: str
    messages: tuple[dict, ...] | None = None
    prompt: str | None = None

    @property
    def token_bound(self) -> int:
        """At most how many tokens the engine scores for this row, without its tokenizer: the
        UTF-8 bytes of its texts (byte-level BPE makes at most one token per byte, and
        SentencePiece falls back to bytes). The chat template's few tokens are not counted."""
        texts = [m["content"] for m in self.messages] if self.messages else [self.prompt or ""]
        return sum(len(text.encode()) for text in texts) + len(self.completion.encode())

    def to_dict(self) -> dict:
        """The row as a JSON object of the accepted shape."""
        if self.messages is not None:
            return {"messages": [dict(m) for m in self.messages], "completion": self.completion}
        return {"prompt": self.prompt, "completion": self.completion}


def parse_eval_set(
    data: bytes,
    *,
    max_rows: int,
    max_bytes: int,
    max_row_chars: int = MAX_ROW_CHARS,
    max_tokens: int | None = None,
    param: str = "file",
) -> list[EvalRow]:
    """Every row of an eval set, or the first thing wrong with it (line and field named).

    `max_tokens` bounds the whole set's scoring work (`EvalRow.token_bound`, summed): rows
    times their length, which the row and byte limits alone let reach a million tokens per
    version. None for sets already stored, read under the limits they were accepted with.
    `param` is the request field the bytes came in (`file`, or `eval` in a version upload).
    """
    if len(data) > max_bytes:
        passed_on = data[: max_bytes + 1].count(b"\n") + 1
        raise UploadTooLarge(
            f"line {passed_on}: the eval set passes this deployment's limit of {max_bytes} bytes "
            "(LORAPLEX_EVAL_MAX_BYTES)",
            param=param,
        )
    text = _decode(data, param)
    rows: list[EvalRow] = []
    tokens = 0
    for number, line in enumerate(text.split("\n"), 1):
        if line.endswith("\r"):
            line = line[:-1]
        if not line.strip():
            continue
        if len(rows) == max_rows:
            raise _invalid(
                number,
                None,
                f"the eval set has more than {max_rows} rows, this deployment's limit "
                "(LORAPLEX_EVAL_MAX_ROWS)",
                param,
            )
        rows.append(_parse_row(line, number, max_row_chars=max_row_chars, param=param))
        if max_tokens is not None:
            tokens += rows[-1].token_bound
            if tokens > max_tokens:
                raise _invalid(
                    number,
                    None,
                    f"the rows up to here hold up to {tokens} tokens to score (counted as the "
                    "UTF-8 bytes of their prompts or messages and completions); this "
                    f"deployment scores at most {max_tokens} per eval set ({TOKENS_SETTING}): "
                    "use fewer or shorter rows",
                    param,
                )
    if not rows:
        raise InvalidEvalSet(
            "the eval set has no rows: send one JSON object per line, each "
            '{"prompt": ..., "completion": ...} or {"messages": [...], "completion": ...}',
            param=param,
        )
    return rows


def _invalid(line: int, field: str | None, problem: str, param: str) -> InvalidEvalSet:
    where = f"line {line}" if field is None else f"line {line}, {field}"
    return InvalidEvalSet(f"{where}: {problem}", param=param, line=line, field=field)


def _decode(data: bytes, param: str) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise _invalid(
            line,
            None,
            f"not UTF-8 (byte 0x{data[exc.start]:02x} at column {column}); eval sets must be "
            "UTF-8 text",
            param,
        ) from None
    return text[1:] if text.startswith(_BOM) else text


def _refuse_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    seen: dict = {}
    for key, value in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen[key] = value
    return seen


class _DuplicateKey(ValueError):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _parse_row(line: str, number: int, *, max_row_chars: int, param: str) -> EvalRow:
    try:
        row = json.loads(line, object_pairs_hook=_refuse_duplicate_keys)
    except _DuplicateKey as exc:
        raise _invalid(number, exc.key[:100], "the field appears twice", param) from None
    except ValueError as exc:  # bad JSON, or an integer of more than 4300 digits
        detail = (
            f"{exc.msg} at column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else exc
        )
        raise _invalid(
            number, None, f"not valid JSON ({detail}); each line must be one JSON object", param
        ) from None
    except RecursionError:
        raise _invalid(number, None, "the JSON is nested too deeply", param) from None
    if not isinstance(row, dict):
        raise _invalid(number, None, f"must be a JSON object, not {_json_kind(row)}", param)
    unknown = sorted(set(row) - set(FIELDS))
    if unknown:
        listed = ", ".join(repr(name[:100]) for name in unknown[:5])
        raise _invalid(
            number,
            unknown[0][:100],
            f"unknown field(s) {listed}; a row holds 'completion' and one of 'messages' or "
            "'prompt'",
            param,
        )
    if ("messages" in row) == ("prompt" in row):
        both = "both" if "messages" in row else "neither"
        raise _invalid(
            number,
            "messages" if both == "both" else None,
            f"has {both} of 'messages' and 'prompt'; give exactly one",
            param,
        )
    completion = row.get("completion")
    if "completion" not in row:
        raise _invalid(number, "completion", "missing; the text the model should answer", param)
    if not isinstance(completion, str) or not completion.strip():
        raise _invalid(number, "completion", "must be a non-empty string", param)
    _require_encodable(completion, number, "completion", param)
    if "prompt" in row:
        prompt = row["prompt"]
        if not isinstance(prompt, str) or not prompt.strip():
            raise _invalid(number, "prompt", "must be a non-empty string", param)
        _require_encodable(prompt, number, "prompt", param)
        chars = len(prompt) + len(completion)
        parsed = EvalRow(line=number, completion=completion, prompt=prompt)
    else:
        messages = _parse_messages(row["messages"], number, param)
        chars = sum(len(m["content"]) for m in messages) + len(completion)
        parsed = EvalRow(line=number, completion=completion, messages=tuple(messages))
    if chars > max_row_chars:
        source = "prompt" if parsed.prompt is not None else "messages"
        raise _invalid(
            number,
            source,
            f"{source} and completion hold {chars} characters; at most {max_row_chars} per row",
            param,
        )
    return parsed


def _parse_messages(messages, number: int, param: str) -> list[dict]:
    try:
        parsed = parse_messages(messages)
    except InvalidMessagesError as exc:
        field = exc.param
        raise _invalid(number, field, str(exc).removeprefix(f"{field} "), param) from None
    if parsed[-1]["role"] == "assistant":
        raise _invalid(
            number,
            f"messages[{len(parsed) - 1}].role",
            "the last message must not be the assistant's: 'completion' is the assistant's "
            "reply to the messages",
            param,
        )
    for i, message in enumerate(parsed):
        _require_encodable(message["content"], number, f"messages[{i}].content", param)
    return parsed


def _require_encodable(text: str, number: int, field: str, param: str) -> None:
    """JSON's \\ud800 escapes can smuggle in lone surrogates, which no UTF-8 text can hold."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise _invalid(
            number, field, "holds an unpaired surrogate (\\ud800-\\udfff escape)", param
        ) from None


def _json_kind(value) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    return "a number or boolean"
