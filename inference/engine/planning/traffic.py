"""How often an adapter is already where a request needs it: a seeded request stream over
the tenants' adapters replayed through an LRU of device slots and an LRU of host copies.

Each request names one adapter, drawn by Zipf's law (the k-th most used in proportion to
1/k^s) or in proportion to counts the registry recorded. Both tiers see every request, as
the engine's do (an adapter in a device slot keeps its host copy), so each tier's hits
only grow with its size. Requests that run together hold their slots for a while in the
engine; the replay does not model that, so it reads as an upper bound when slots are few
against the concurrency.
"""

import math
import random
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

SEED = 0
MIN_REQUESTS = 20_000
REQUESTS_PER_ADAPTER = 50


@dataclass(frozen=True)
class HitRates:
    device: float  # share of requests whose adapter sat in a device slot
    host: float  # ... in host memory only (a swap-in)
    disk: float  # ... in neither (a load from disk or object storage)
    requests: int  # requests replayed (after a warm-up of as many more)


def zipf_weights(adapters: int, s: float) -> list[float]:
    return [1.0 / (k**s) for k in range(1, adapters + 1)]


def expected_distinct(weights: Sequence[float], requests: int) -> int:
    """The distinct adapters `requests` independent draws are expected to name (rounded up):
    the adapters a batch of that many requests holds in device slots at once."""
    total = sum(weights)
    return math.ceil(sum(1 - (1 - w / total) ** requests for w in weights) - 1e-9)


def simulate(weights: Sequence[float], device_slots: int, host_slots: int) -> HitRates:
    """Replay a seeded stream (a warm-up first, not counted) through both tiers."""
    if not weights or device_slots < 0 or host_slots < device_slots:
        raise ValueError("need adapters, and host_slots >= device_slots >= 0")
    n = max(MIN_REQUESTS, REQUESTS_PER_ADAPTER * len(weights))
    stream = random.Random(SEED).choices(range(len(weights)), weights=weights, k=2 * n)
    device: OrderedDict[int, None] = OrderedDict()
    host: OrderedDict[int, None] = OrderedDict()
    hits = {"device": 0, "host": 0, "disk": 0}
    for i, adapter in enumerate(stream):
        tier = "device" if adapter in device else "host" if adapter in host else "disk"
        if i >= n:
            hits[tier] += 1
        _touch(host, adapter, host_slots)
        _touch(device, adapter, device_slots)
    return HitRates(hits["device"] / n, hits["host"] / n, hits["disk"] / n, n)


def _touch(lru: "OrderedDict[int, None]", key: int, capacity: int) -> None:
    if capacity == 0:
        return
    lru[key] = None
    lru.move_to_end(key)
    if len(lru) > capacity:
        lru.popitem(last=False)
