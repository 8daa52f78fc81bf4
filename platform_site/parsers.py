"""The REST API's JSON parser: DRF's, except that a body nested too deep or holding text
that is not Unicode is the caller's 400.

DRF turns the `ValueError`s of `json.loads` into a ParseError, but a body like `[[[[...` a
hundred thousand deep raises RecursionError instead, which would answer as a 500; and a lone
surrogate (`"\\ud800"`) parses, then fails where the database encodes it (unicode_text.py).
"""

from rest_framework import parsers
from rest_framework.exceptions import ParseError, ValidationError

from .unicode_text import first_invalid_text


class InvalidText(ValidationError):
    """A 400 whose `param` is the field's path in the body (error_responses reads it)."""

    def __init__(self, message: str, param: str | None):
        super().__init__(message)
        self.param = param


class JSONParser(parsers.JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - the body is nested too deeply.") from None
        found = first_invalid_text(data)
        if found is not None:
            raise InvalidText(found.message(), found.param)
        return data
