"""Every string of a request body holds text the tokenizer (and UTF-8) can carry.

JSON may spell a lone UTF-16 surrogate (`"\\ud800"`), and Python's parser gives it back as a
one-character string that no UTF-8 encoder, database driver or Rust tokenizer accepts: the
tokenizer raised a TypeError deep in generation (a 500). Surrogates are the only code points
a Python string can hold that Unicode text cannot, so they are what is refused, once, where
a body is read (protocol.load_json): every field of every endpoint, keys included, before
any parser or tokenizer sees it. The refusal names the field by its path in the body
(`messages[0].content`, `input[2].content[0].text`), the names the parsers' own refusals use.
Refused rather than replaced by U+FFFD: a caller's broken text is a bug to fix, and a quiet
replacement would change the prompt it sent.
"""

import re

from inference.errors import ProtocolError

_SURROGATE = re.compile(r"[\ud800-\udfff]")
_TEXT_OR_CONTAINER = (str, dict, list)


def refuse_invalid_text(body: object) -> None:
    """A ProtocolError naming the first string (or object key) of `body`, in document order,
    that holds a surrogate; linear in the body, and iterative (a deeply nested body is no
    recursion)."""
    stack: list[tuple[object, str]] = [(body, "")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            _check(value, path, path)
        elif isinstance(value, dict):
            for key in value:
                _check(key, _join(path, _printable(key)), f"a key of {path or 'the body'}")
            stack.extend(
                (item, _join(path, key))
                for key, item in reversed(value.items())
                if isinstance(item, _TEXT_OR_CONTAINER)
            )
        elif isinstance(value, list):  # a long list of token ids builds no paths
            stack.extend(
                (item, f"{path}[{i}]")
                for i, item in reversed(list(enumerate(value)))
                if isinstance(item, _TEXT_OR_CONTAINER)
            )


def _check(text: str, param: str, where: str) -> None:
    if text.isascii():
        return
    found = _SURROGATE.search(text)
    if found is None:
        return
    raise ProtocolError(
        f"{where} holds an unpaired UTF-16 surrogate (U+{ord(found.group()):04X}) at character "
        f"{found.start()}: text must be valid Unicode. Send UTF-8, and a character outside "
        "the Basic Multilingual Plane escaped as a surrogate pair (\\ud83d\\ude00), never half "
        "of one.",
        param=param or None,
    )


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _printable(key: str) -> str:
    """A key named in a refusal: its surrogates escaped, so the answer is text."""
    return key.encode("utf-8", "backslashreplace").decode("utf-8")
