"""A multipart/form-data body's parts followed as its bytes pass, as Django will split them.

The ASGI layer (body_limits.py) feeds each chunk here before Django reads it, so a part over
its limit is refused while the body is still arriving rather than once it is all on disk.
The parts are found the way Django's own parser finds them (django.http.multipartparser: a
part ends at every `--boundary`, its headers lie in its first MAX_TOTAL_HEADER_SIZE bytes,
each header line read with `parse_header_parameters`), so no body can show this scanner one
part and Django another. Bytes are only counted, never kept; a body Django cannot parse is
Django's to refuse (400), so nothing here raises for a malformed one.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.http import multipartparser
from django.http.multipartparser import MultiPartParser
from django.utils.http import parse_header_parameters

# The room Django's parser gives a part's headers (missing from Django's type stubs).
MAX_TOTAL_HEADER_SIZE: int = getattr(multipartparser, "MAX_TOTAL_HEADER_SIZE")  # noqa: B009

# The CRLF before a boundary is not the part's: a count within it of the limit is not over.
_CRLF = 2
# A base64 part (deprecated in forms, RFC 7578) holds 4/3 of its bytes plus line breaks;
# Django decodes it and enforces the exact limit, this only stops one far past it.
_BASE64_ALLOWANCE = 2


@dataclass(frozen=True)
class Part:
    name: str
    is_file: bool  # a file part (a `filename`) rather than a form field
    base64: bool = False


class PartOverLimit(Exception):
    """A part (or the form fields together) passed its limit; `part` names the culprit."""

    def __init__(self, part: Part, limit: int):
        super().__init__(f"part {part.name!r} is over {limit} bytes")
        self.part, self.limit = part, limit


def boundary_of(content_type: str) -> bytes | None:
    """The boundary Django will split on, or None where Django refuses the body itself."""
    if not content_type.startswith("multipart/") or not content_type.isascii():
        return None
    try:
        _, params = parse_header_parameters(content_type)
    except ValueError:
        return None
    boundary = params.get("boundary")
    if not boundary or not MultiPartParser.boundary_re.fullmatch(boundary):
        return None
    return boundary.encode("ascii")


class PartScanner:
    """Counts each part's bytes against `file_limits` (file parts, by field name) and the form
    fields' together against `fields_limit` (Django's DATA_UPLOAD_MAX_MEMORY_SIZE, counted
    as Django counts it); `feed` raises PartOverLimit once one is passed."""

    def __init__(self, boundary: bytes, file_limits: dict[str, int], fields_limit: int | None):
        self.delimiter = b"--" + boundary
        self.file_limits = file_limits
        self.fields_limit = fields_limit
        self.part: Part | None = None  # the part being received, if it has a name
        self._held = b""  # a chunk's last bytes: they may begin the next delimiter
        self._head: bytearray | None = bytearray()  # the part's first bytes, until parsed
        self._size = 0  # the part's bytes after its headers
        self._fields = 0  # the form fields' bytes before this part, as Django counts them

    def feed(self, chunk: bytes) -> None:
        data = self._held + chunk if self._held else chunk
        start, step = 0, len(self.delimiter)
        while (found := data.find(self.delimiter, start)) >= 0:
            self._take(data, start, found)
            # a part's last two bytes are still here (held below), to drop its line break
            self._end_part(data[max(start, found - 2) : found])
            start = found + step
        keep = max(start, len(data) - (step + 1))  # a delimiter's start, and 2 bytes before
        self._take(data, start, keep)
        self._held = data[keep:]

    def finish(self) -> None:
        """The body has ended: a last part no delimiter closes, which Django reads whole."""
        held, self._held = self._held, b""
        self._take(held, 0, len(held))
        if self._head is not None:
            self._read_headers()
        self._check(self._size)

    def _take(self, data: bytes, start: int, stop: int) -> None:
        """`data[start:stop]` is the current part's: its headers first, then counted."""
        if self._head is not None:
            taken = min(stop - start, MAX_TOTAL_HEADER_SIZE - len(self._head))
            self._head += data[start : start + taken]
            start += taken
            if len(self._head) < MAX_TOTAL_HEADER_SIZE:
                return  # the headers may go on: wait for more, or for the part's end
            self._read_headers()
        self._count(stop - start)

    def _read_headers(self) -> None:
        """Django reads a part's headers from its first bytes: past them, its data."""
        head, self._head = bytes(self._head or b""), None
        end = head.find(b"\r\n\r\n")
        if end < 0:  # no headers (Django skips it) or too long ones (Django's 400)
            return
        self.part = part_from_headers(head[:end])
        self._count(len(head) - end - 4)

    def _count(self, size: int) -> None:
        """While a part arrives, its last two bytes may turn out to be the line break."""
        self._size += size
        if size:
            self._check(self._size - _CRLF)

    def _check(self, size: int) -> None:
        part = self.part
        if part is None:
            return
        if part.is_file:
            limit = self.file_limits.get(part.name)
            allowed = limit * (_BASE64_ALLOWANCE if part.base64 else 1) if limit is not None else 0
            if limit is not None and size > allowed:
                raise PartOverLimit(part, limit)
        elif self.fields_limit is not None and self._field_bytes(size) > self.fields_limit:
            raise PartOverLimit(part, self.fields_limit)

    def _field_bytes(self, size: int) -> int:
        """Django counts each field's value and its name plus two (as in `name=value&`)."""
        assert self.part is not None
        return self._fields + max(size, 0) + len(self.part.name) + 2

    def _end_part(self, last: bytes) -> None:
        """The part is whole: its exact size, without the line break Django strips."""
        if self._head is not None:  # shorter than the header room: Django reads it stripped
            del self._head[len(self._head) - _line_break(bytes(self._head[-2:])) :]
            self._read_headers()
            size = self._size
        else:
            size = self._size - _line_break(last)
        self._check(size)
        if self.part is not None and not self.part.is_file:
            self._fields = self._field_bytes(size)
        self.part, self._head, self._size = None, bytearray(), 0


def _line_break(last: bytes) -> int:
    """How many of a part's last bytes Django drops before a boundary: a \n, then a \r."""
    dropped = 1 if last.endswith(b"\n") else 0
    return dropped + (1 if last[: len(last) - dropped].endswith(b"\r") else 0)


def part_from_headers(header: bytes) -> Part | None:
    """A part's name and kind from its header lines, read as parse_boundary_stream reads
    them (the last Content-Disposition wins; a line that does not parse is skipped)."""
    disposition: dict[str, str] | None = None
    encoding = None
    for line in header.split(b"\r\n"):
        try:
            main, params = parse_header_parameters(line.decode())
            name, value = main.split(":", 1)
        except ValueError:
            continue
        if name == "content-disposition":
            disposition = params
        elif name == "content-transfer-encoding":
            encoding = value.strip()
    if disposition is None or "name" not in disposition:
        return None
    try:
        field = disposition["name"].encode().strip().decode(errors="replace")
    except UnicodeError:
        return None
    return Part(field, is_file=bool(disposition.get("filename")), base64=encoding == "base64")
