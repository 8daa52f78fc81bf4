"""API keys this process verified in the last second, by the HMAC of the raw key (the hash
the database stores, so the raw key is never kept). A hot key then costs no query and no
thread hop per request, and a revocation, an expiry or a suspended tenant still takes effect
in every process within that second: a cached key is checked again on every use, and its
row is read again once its second is up."""

import threading
import time

from .models import ApiKey

KEY_CACHE_SECONDS = 1.0
MAX_CACHED_KEYS = 10_000  # distinct keys seen in one second; beyond it, expired ones go first


class ApiKeyCache:
    def __init__(self, seconds: float = KEY_CACHE_SECONDS, clock=time.monotonic):
        self.seconds = seconds
        self.clock = clock
        self._keys: dict[str, tuple[float, ApiKey]] = {}
        self._lock = threading.Lock()

    def get(self, hashed: str) -> ApiKey | None:
        entry = self._keys.get(hashed)
        if entry is None or self.clock() >= entry[0]:
            return None
        return entry[1]

    def put(self, hashed: str, api_key: ApiKey) -> None:
        now = self.clock()
        with self._lock:
            if len(self._keys) >= MAX_CACHED_KEYS:
                self._keys = {h: e for h, e in self._keys.items() if e[0] > now}
                if len(self._keys) >= MAX_CACHED_KEYS:
                    self._keys.clear()
            self._keys[hashed] = (now + self.seconds, api_key)

    def discard(self, hashed: str) -> None:
        with self._lock:
            self._keys.pop(hashed, None)

    def clear(self) -> None:
        with self._lock:
            self._keys.clear()


KEYS = ApiKeyCache()


def forget_key(sender, instance: ApiKey, **kwargs) -> None:
    """A key saved or deleted in this process is read again at its next use."""
    KEYS.discard(instance.hashed_key)


def forget_tenant_keys(sender, instance, **kwargs) -> None:
    """A tenant saved (suspended, say): every key is read again, its tenant with it."""
    KEYS.clear()
