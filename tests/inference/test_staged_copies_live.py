"""The attack on a live `serve`, replayed: a same-size write to a staged adapter file.

Before, the next request for the adapter (once the engine read it from disk again) was a
503 `adapter_unavailable`, and every one after it, until someone deleted the folder by
hand: the folder was checked by size only. Now the request waits for a fresh copy from
object storage and gets the answer it got before, /metrics counts the restage, and a
version whose stored copy is bad too fails alone while the base model is served.
"""

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.inference.conftest import BASE_NAME, start_server, stop_server
from tests.registry.test_staged_copies import WEIGHTS, corrupt_in_place
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db
OPERATOR_TOKEN = "operator-token-for-the-restage-tests"


@pytest.fixture(scope="module")
def server(serve_data):
    cache = serve_data["tmp"] / "restage-cache"
    url, proc, log = start_server(
        serve_data["tmp"],
        {"LORAPLEX_ADAPTER_CACHE_DIR": str(cache), "LORAPLEX_OPERATOR_TOKEN": OPERATOR_TOKEN},
        name="serve-restage",
    )
    yield url, cache
    stop_server(proc)


@pytest.fixture(scope="module")
def pirate(django_db_blocker):
    from registry.models import AdapterVersion

    with django_db_blocker.unblock():
        return AdapterVersion.objects.get(adapter__tenant__slug="serve-a", adapter__name="pirate")


def chat(url: str, key: str, model: str) -> httpx.Response:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Say something."}],
        "max_tokens": 8,
        "temperature": 0,
    }
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=120)


def evict_from_memory(url: str) -> None:
    """The next request reads the adapter from disk, as after a host-cache eviction."""
    response = httpx.post(
        f"{url}/v1/unload_lora_adapter",
        json={"lora_name": "serve-a/pirate"},
        headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"},
        timeout=60,
    )
    assert response.status_code == 200, response.text


def restages(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=60).text
    (family,) = [f for f in text_string_to_metric_families(text) if f.name.endswith("restages")]
    return {s.labels["reason"]: s.value for s in family.samples if s.name.endswith("_total")}


def test_a_damaged_staged_file_heals_and_the_metric_counts_it(server, serve_data, pirate):
    url, cache = server
    key = serve_data["keys"][0]
    first = chat(url, key, "pirate")
    assert first.status_code == 200, first.text
    text = first.json()["choices"][0]["message"]["content"]
    weights = cache / pirate.uid.hex / WEIGHTS
    wait_for(weights.is_file, what="the staged copy on disk")

    corrupt_in_place(weights)  # the attack: same size, other bytes
    evict_from_memory(url)
    healed = chat(url, key, "pirate")  # before: 503 adapter_unavailable, then for ever
    assert healed.status_code == 200, healed.text
    assert healed.json()["choices"][0]["message"]["content"] == text

    corrupt_in_place(weights, keep_mtime=True)  # and with the file's time put back
    evict_from_memory(url)
    again = chat(url, key, "pirate")
    assert again.status_code == 200, again.text
    assert again.json()["choices"][0]["message"]["content"] == text
    assert restages(url) == {"size": 0, "modified": 1, "load_failed": 1}


def test_a_version_whose_stored_copy_is_bad_too_fails_alone(server, serve_data, pirate):
    """Last in the module: it leaves the stored copy broken."""
    from registry import objectstore

    url, cache = server
    key = serve_data["keys"][0]
    assert chat(url, key, "pirate").status_code == 200
    corrupt_in_place(objectstore.storage().path(pirate.weights_key), keep_mtime=True)
    corrupt_in_place(cache / pirate.uid.hex / WEIGHTS, keep_mtime=True)
    evict_from_memory(url)
    broken = chat(url, key, "pirate")
    assert broken.status_code == 503, broken.text
    error = broken.json()["error"]
    assert error["code"] == "adapter_unavailable"
    assert "stored bytes changed since upload" in error["message"]
    assert chat(url, key, BASE_NAME).status_code == 200  # the rest is served
