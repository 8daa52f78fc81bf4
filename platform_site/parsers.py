"""The REST API's JSON parser: DRF's, except that a body nested too deep is the caller's 400.

DRF turns the `ValueError`s of `json.loads` into a ParseError, but a body like `[[[[...` a
hundred thousand deep raises RecursionError instead, which would answer as a 500.
"""

from rest_framework import parsers
from rest_framework.exceptions import ParseError


class JSONParser(parsers.JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - the body is nested too deeply.") from None
