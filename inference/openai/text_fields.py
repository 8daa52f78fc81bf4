"""Every string of a request body holds text the tokenizer (and UTF-8) can carry.

Refused rather than replaced by U+FFFD: a caller's broken text is a bug to fix, and a quiet
replacement would change the prompt it sent. Checked once, where a body is read
(protocol.load_json): every field of every endpoint, keys included, before any parser or
tokenizer sees it (platform_site/unicode_text.py says what is looked for).
"""

from inference.errors import ProtocolError
from platform_site.unicode_text import first_invalid_text


def refuse_invalid_text(body: object) -> None:
    """A ProtocolError naming the first string (or object key) of `body` that holds a lone
    surrogate."""
    found = first_invalid_text(body)
    if found is not None:
        raise ProtocolError(found.message(), param=found.param)
