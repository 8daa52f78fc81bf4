"""How exceptions that are not ApiErrors answer, as each app declares for its own.

Plain Python, so an app registers its table from its AppConfig.ready() without importing
the error responses (and, through them, DRF's views).
"""

from dataclasses import dataclass

from .errors import ApiError


@dataclass(frozen=True)
class Translation:
    """How an exception answers: as `api_error`, naming `param` unless the exception names
    its own field, in `words` when its own text is not for the caller."""

    api_error: type[ApiError]
    param: str | None = None
    words: str | None = None


# Exception class -> its translation, looked up along the exception's MRO before the
# frameworks' own (platform_site/error_responses.py).
REGISTERED: dict[type[BaseException], Translation] = {}


def register_translations(table: dict[type[BaseException], Translation]) -> None:
    REGISTERED.update(table)
