"""`s3://bucket/prefix/`, parsed strictly: one parser for the import prefixes an operator
allows a tenant (tenants) and the sources a tenant imports from (registry).

Prefixes are compared segment by segment, so `s3://b/acme/` contains `s3://b/acme/run-1/`
but not `s3://b/acme-evil/`; a location with `.`, `..` or empty segments is refused rather
than normalised, so no spelling of a path can step outside a prefix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_LOCATION = re.compile(r"s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])/(.*)", re.DOTALL)


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str  # "" (the whole bucket) or segments, each ending in "/"

    def key(self, file: str) -> str:
        return self.prefix + file

    def contains(self, other: S3Location) -> bool:
        """`other` lies at or under this location (whole segments only)."""
        return other.bucket == self.bucket and other.prefix.startswith(self.prefix)

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


def parse_s3_location(text: str) -> S3Location:
    """The location `text` names; ValueError saying what is wrong otherwise."""
    match = _LOCATION.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"must look like s3://bucket/prefix/, got {text[:200]!r}")
    bucket, prefix = match[1], match[2]
    if any(ord(c) < 32 or ord(c) == 127 for c in prefix):
        raise ValueError("the prefix must not contain control characters")
    parts = [p for p in prefix.split("/") if p]
    if any(p in (".", "..") for p in parts) or "//" in prefix or "\\" in prefix:
        raise ValueError("the prefix must not contain '.', '..' or empty segments")
    return S3Location(bucket, "/".join(parts) + "/" if parts else "")


def parse_s3_locations(lines: str) -> list[S3Location]:
    """One location per non-blank line; ValueError naming the first bad line."""
    locations = []
    for number, line in enumerate(lines.splitlines(), 1):
        if line.strip():
            try:
                locations.append(parse_s3_location(line))
            except ValueError as exc:
                raise ValueError(f"line {number}: {exc}") from None
    return locations
