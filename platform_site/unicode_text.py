"""Where a parsed JSON body holds a string that is not Unicode text.

JSON may spell a lone UTF-16 surrogate (`"\\ud800"`), and Python's parser gives it back as a
one-character string that no UTF-8 encoder, database driver or Rust tokenizer accepts: left
in, it fails deep in a tokenizer or a database write (a 500). Surrogates are the only code
points a Python string can hold that Unicode text cannot, so they are what is looked for,
once, where a body is read: the REST API's parser (parsers.py) and the serving layer's
(inference/openai/protocol.py) both refuse them, naming the field by its path in the body
(`messages[0].content`, `metadata.k`), the names the error model uses for every field.
"""

import re
from dataclasses import dataclass

_SURROGATE = re.compile(r"[\ud800-\udfff]")
_TEXT_OR_CONTAINER = (str, dict, list)


@dataclass(frozen=True)
class InvalidText:
    param: str | None  # the field's path; None for the body itself
    where: str  # the field in words, for the message
    code_point: int
    index: int  # the character it stands at

    def message(self) -> str:
        return (
            f"{self.where} holds an unpaired UTF-16 surrogate (U+{self.code_point:04X}) at "
            f"character {self.index}: text must be valid Unicode. Send UTF-8, and a character "
            "outside the Basic Multilingual Plane escaped as a surrogate pair (\\ud83d\\ude00), "
            "never half of one."
        )


def first_invalid_text(body: object) -> InvalidText | None:
    """The first string (or object key) of `body`, in document order, that holds a surrogate;
    linear in the body, and iterative (a deeply nested body is no recursion)."""
    stack: list[tuple[object, str]] = [(body, "")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            found = _invalid(value, path, path or "the body")
        elif isinstance(value, dict):
            found = None
            for key in value:
                found = _invalid(
                    key, _join(path, _printable(key)), f"a key of {path or 'the body'}"
                )
                if found is not None:
                    break
            stack.extend(
                (item, _join(path, key))
                for key, item in reversed(value.items())
                if isinstance(item, _TEXT_OR_CONTAINER)
            )
        elif isinstance(value, list):  # a long list of token ids builds no paths
            found = None
            stack.extend(
                (item, f"{path}[{i}]")
                for i, item in reversed(list(enumerate(value)))
                if isinstance(item, _TEXT_OR_CONTAINER)
            )
        else:
            found = None
        if found is not None:
            return found
    return None


def _invalid(text: str, param: str, where: str) -> InvalidText | None:
    if text.isascii():
        return None
    found = _SURROGATE.search(text)
    if found is None:
        return None
    return InvalidText(param or None, where, ord(found.group()), found.start())


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _printable(key: str) -> str:
    """A key named in a refusal: its surrogates escaped, so the answer is text."""
    return key.encode("utf-8", "backslashreplace").decode("utf-8")
