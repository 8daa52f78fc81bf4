"""API key material: format, generation and the keyed hash. No database here.

A key reads `lpx_<prefix>_<secret>`. The prefix is public (shown in lists, used to find the
row); the secret has 256 bits of entropy and is kept only as HMAC-SHA256 under a server
secret. A fast keyed hash fits because the secret is random, not a password; a password
hasher would make every API request pay tens of milliseconds.
"""

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

from django.conf import settings

KEY_PREFIX = "lpx"
_KEY_RE = re.compile(r"^lpx_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")


@dataclass(frozen=True)
class NewKey:
    prefix: str
    secret: str

    @property
    def full(self) -> str:
        return f"{KEY_PREFIX}_{self.prefix}_{self.secret}"


def generate_key() -> NewKey:
    return NewKey(prefix=secrets.token_hex(6), secret=secrets.token_urlsafe(32))


def split_key(raw: str) -> tuple[str, str] | None:
    """(prefix, secret) for a well-formed key, else None."""
    match = _KEY_RE.match(raw or "")
    return (match.group(1), match.group(2)) if match else None


def hash_key(raw: str) -> str:
    secret = settings.API_KEY_HMAC_SECRET.encode()
    return hmac.new(secret, raw.encode(), hashlib.sha256).hexdigest()


def key_matches(raw: str, stored_hash: str) -> bool:
    return hmac.compare_digest(hash_key(raw), stored_hash)
