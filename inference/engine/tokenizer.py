"""Text <-> token ids, chat templates, and streaming detokenization for one model folder.

Built on the `tokenizers` library and jinja2 alone, so the engine runs on a box without
transformers. The chat template renders the way Hugging Face renders it (sandboxed jinja2,
trim_blocks/lstrip_blocks, `raise_exception`, `strftime_now`, a `tojson` that keeps non-ASCII),
so a prompt built here is the prompt the model was trained to see.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

import jinja2
import jinja2.ext
import jinja2.meta
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as _HFTokenizer

from .errors import EngineError

REPLACEMENT_CHAR = "\ufffd"


class TokenizerError(EngineError):
    """A tokenizer folder, token id, or chat conversation that cannot be used as given."""


def _read_json(path: Path, required: bool) -> dict[str, Any]:
    if not path.is_file():
        if required:
            raise TokenizerError(f"{path} is missing; a tokenizer folder needs it")
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TokenizerError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise TokenizerError(f"{path} must hold a JSON object")
    return data


def _token_text(value: object) -> str | None:
    # tokenizer_config writes special tokens either as a string or as an AddedToken dict.
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _ids(value: object) -> list[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def _tojson(
    value: object,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # jinja2's own tojson HTML-escapes '<' and '&', which would change what the model sees.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> NoReturn:
    raise jinja2.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def compile_chat_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateError as exc:
        raise TokenizerError(f"the chat template does not compile: {exc}") from exc


def _chat_template_source(folder: Path, config: dict[str, Any]) -> str | None:
    # transformers 5 saves the template beside the config; older folders keep it inside.
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if template is not None and not isinstance(template, str):
        raise TokenizerError("tokenizer_config.json: chat_template must be a string")
    return template


class Tokenizer:
    """One model's tokenizer: encode, decode, chat prompts, and the ids that end generation."""

    def __init__(
        self,
        backend: _HFTokenizer,
        special_tokens: dict[str, str],
        eos_token_ids: list[int],
        chat_template: str | None,
    ):
        self._backend = backend
        self.special_tokens = special_tokens  # bos_token, eos_token, ... as the template sees them
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        # The most characters one token covers (a byte-level token's characters are its
        # bytes, each standing for at most one character of text): a text of n characters
        # is at least n / max_token_chars tokens, which bounds a prompt before encoding it.
        self.max_token_chars: int = max(
            map(len, backend.get_vocab(with_added_tokens=True)), default=1
        )
        bos = special_tokens.get("bos_token")
        self.bos_token_id: int | None = None if bos is None else backend.token_to_id(bos)
        self.eos_token_ids: list[int] = eos_token_ids
        self._template = None if chat_template is None else compile_chat_template(chat_template)
        # Whether the template reads `tools`: one that never does cannot show them to the model.
        self.supports_tools = False
        if chat_template is not None and self._template is not None:
            parsed = self._template.environment.parse(chat_template)
            self.supports_tools = "tools" in jinja2.meta.find_undeclared_variables(parsed)

    @classmethod
    def from_folder(cls, path: str | os.PathLike[str]) -> Tokenizer:
        folder = Path(path)
        if not folder.is_dir():
            raise TokenizerError(f"tokenizer folder not found: {folder}")
        if not (folder / "tokenizer.json").is_file():
            raise TokenizerError(
                f"{folder / 'tokenizer.json'} is missing; a tokenizer folder needs it"
            )
        try:
            backend = _HFTokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as exc:  # the Rust side raises a bare Exception for any bad content
            raise TokenizerError(
                f"{folder / 'tokenizer.json'} is not a valid tokenizer: {exc}"
            ) from exc
        config = _read_json(folder / "tokenizer_config.json", required=False)

        special_tokens = {}
        for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
            text = _token_text(config.get(key))
            if text is None:
                continue
            if backend.token_to_id(text) is None:
                raise TokenizerError(
                    f"tokenizer_config.json: {key} {text!r} is not in the vocabulary"
                )
            special_tokens[key] = text

        eos_ids: list[int] = []
        eos = special_tokens.get("eos_token")
        if eos is not None and (eos_id := backend.token_to_id(eos)) is not None:
            eos_ids.append(eos_id)  # in the vocabulary: checked above
        for name in ("config.json", "generation_config.json"):
            eos_ids += _ids(_read_json(folder / name, required=False).get("eos_token_id"))
        vocab_size = backend.get_vocab_size(with_added_tokens=True)
        for token_id in eos_ids:
            if not 0 <= token_id < vocab_size:
                raise TokenizerError(
                    f"eos_token_id {token_id} is outside the vocabulary ({vocab_size})"
                )
        return cls(
            backend,
            special_tokens,
            list(dict.fromkeys(eos_ids)),
            _chat_template_source(folder, config),
        )

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids for `text`; special tokens written in the text (like <|im_start|>) stay
        whole. Through the batch path, which releases the GIL while the Rust side works (the
        single-text `encode` keeps it: a megabyte held every other thread, the event loop
        and the step thread included, for about a second); the ids are the same."""
        if not isinstance(text, str):
            raise TokenizerError(f"encode() needs a str, got {type(text).__name__}")
        try:
            (encoding,) = self._backend.encode_batch([text], add_special_tokens=add_special_tokens)
        except TypeError:  # a lone surrogate: text no UTF-8 (nor Rust) can hold
            raise TokenizerError(
                "the text is not valid Unicode (it holds a lone surrogate)"
            ) from None
        return encoding.ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """The text of `ids`, through the batch path (it releases the GIL, as encode's)."""
        self._check_ids(ids)
        (text,) = self._backend.decode_batch([list(ids)], skip_special_tokens=skip_special_tokens)
        return text

    def token_strings(self, ids: list[int]) -> list[str]:
        """Each id's vocabulary entry as stored (a byte-level `Ġthe`, say), not decoded text:
        what a client inspecting the tokenization wants to see."""
        self._check_ids(ids)
        return [self._backend.id_to_token(token_id) or "" for token_id in ids]

    def _check_ids(self, ids: Iterable[object]) -> None:
        for token_id in ids:
            if isinstance(token_id, bool) or not isinstance(token_id, int):
                raise TokenizerError(f"token ids must be ints, got {token_id!r}")
            if not 0 <= token_id < self.vocab_size:
                raise TokenizerError(
                    f"token id {token_id} is outside the vocabulary ({self.vocab_size})"
                )

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """The prompt text for a conversation, as the model's own chat template writes it.
        `tools`: the function definitions the model may call (Hugging Face's convention,
        `{"type": "function", "function": {...}}`), for a template that `supports_tools`."""
        if self._template is None:
            raise TokenizerError("this model has no chat template; send a plain prompt instead")
        if not isinstance(messages, list) or not messages:
            raise TokenizerError("messages must be a non-empty list of {'role', 'content'} objects")
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise TokenizerError(f"messages[{i}] must be an object with a string 'role'")
        if tools is not None and not self.supports_tools:
            raise TokenizerError("this model's chat template does not support tools")
        try:
            return self._template.render(
                messages=messages,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                **self.special_tokens,
            )
        except jinja2.TemplateError as exc:
            raise TokenizerError(f"the chat template rejected these messages: {exc}") from exc
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
            # e.g. content that is not a string where the template concatenates strings
            raise TokenizerError(
                f"the chat template could not render these messages: {exc}"
            ) from exc

    def detokenizer(self, skip_special_tokens: bool = True) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self, skip_special_tokens)


class IncrementalDetokenizer:
    """Streams text for generated ids without ever splitting a UTF-8 character.

    A byte-level token can end in the middle of a character (half an emoji). Each push decodes
    only a short window: the tokens since the last emission plus the tokens of that emission as
    context, and emits the part of the window's text beyond the context once it no longer ends in
    an incomplete character. The context keeps decoders that treat a leading token specially
    (SentencePiece's leading space) consistent, and the window keeps each step O(1).
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix_offset = 0  # start of the context window
        self._read_offset = 0  # first id whose text has not been emitted
        self.text = ""

    def _decode(self, start: int, end: int | None = None) -> str:
        return self._tokenizer._backend.decode(self._ids[start:end], skip_special_tokens=self._skip)

    def push(self, token_id: int) -> str:
        self._tokenizer._check_ids([token_id])
        self._ids.append(token_id)
        context = self._decode(self._prefix_offset, self._read_offset)
        window = self._decode(self._prefix_offset)
        if len(window) <= len(context) or window.endswith(REPLACEMENT_CHAR):
            return ""  # nothing new, or a character still waiting for its last bytes
        new_text = window[len(context) :]
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        self.text += new_text
        return new_text

    def flush(self) -> str:
        """Whatever the window still holds (a genuinely broken byte sequence ends as U+FFFD)."""
        context = self._decode(self._prefix_offset, self._read_offset)
        window = self._decode(self._prefix_offset)
        new_text = window[len(context) :]
        self._prefix_offset = self._read_offset = len(self._ids)
        self.text += new_text
        return new_text
