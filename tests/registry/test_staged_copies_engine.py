"""Through the engine's loader path (a real engine with the serving layer's loader callback,
inference/host/engine_host._fetch_adapter): a request for a version whose staged copy was
damaged on disk waits for a fresh copy from object storage and gets the answer it got
before; a version whose stored copy is bad too fails alone, with a clear error, while other
adapters and the base model are served. /metrics counts each restage by how it was found.

Before, both damaged copies below were 503 for good: the folder was checked by size only.
"""

import pytest
from prometheus_client.parser import text_string_to_metric_families

from inference import metrics
from inference.engine import EngineRequest, LLMEngine, SamplingParams
from inference.engine.errors import AdapterLoadError
from inference.host.engine_host import _fetch_adapter
from inference.resolution import lora_request_for
from registry import objectstore
from registry.staging import version_dir
from tests.engine.lora_fixtures import run_all
from tests.registry.conftest import make_ready_version
from tests.registry.test_staged_copies import WEIGHTS, corrupt_in_place

pytestmark = pytest.mark.django_db(transaction=True)  # the loader threads read the rows
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


def restages_on_metrics() -> dict[str, float]:
    text = metrics.render().decode()
    (family,) = [f for f in text_string_to_metric_families(text) if f.name.endswith("restages")]
    return {s.labels["reason"]: s.value for s in family.samples if s.name.endswith("_total")}


@pytest.fixture
def engine(tiny_base_dir):
    engine = LLMEngine(
        model=tiny_base_dir,
        enable_lora=True,
        max_loras=2,
        max_lora_rank=8,
        kv_cache_bytes=2 << 20,
        lora_loader=_fetch_adapter,
    )
    yield engine
    engine.close()


def answer(engine, request_id, version=None) -> dict:
    lora = lora_request_for(version) if version is not None else None
    engine.add_request(EngineRequest(request_id, "Paris is", GREEDY, lora_request=lora))
    result = run_all(engine)[request_id]
    if version is not None:  # from disk next time: as a host-cache miss would
        engine.unload_lora(str(version.uid))
    return result


def test_a_damaged_staged_copy_is_fetched_again_and_answers_as_before(
    engine, adapter, good_adapter_dir, second_adapter_dir
):
    version = make_ready_version(adapter, good_adapter_dir)
    first = answer(engine, "first", version)  # staged by the loader on this miss
    assert first["error"] is None
    before = restages_on_metrics()

    corrupt_in_place(version_dir(version) / WEIGHTS)  # a same-size write
    assert answer(engine, "after-write", version)["tokens"] == first["tokens"]
    corrupt_in_place(version_dir(version) / WEIGHTS, keep_mtime=True)  # the time put back
    assert answer(engine, "after-silent-write", version)["tokens"] == first["tokens"]

    after = restages_on_metrics()
    assert after["modified"] - before["modified"] == 1
    assert after["load_failed"] - before["load_failed"] == 1
    assert after["size"] == before["size"]


def test_a_version_whose_stored_copy_is_bad_too_fails_alone(
    engine, adapter, good_adapter_dir, second_adapter_dir
):
    broken = make_ready_version(adapter, good_adapter_dir)
    healthy = make_ready_version(adapter, second_adapter_dir)
    assert answer(engine, "warm", broken)["error"] is None
    corrupt_in_place(objectstore.storage().path(broken.weights_key), keep_mtime=True)
    corrupt_in_place(version_dir(broken) / WEIGHTS, keep_mtime=True)

    requests = {"broken": broken, "healthy": healthy, "base": None}
    for request_id, version in requests.items():
        lora = lora_request_for(version) if version is not None else None
        engine.add_request(EngineRequest(request_id, "Paris is", GREEDY, lora_request=lora))
    results = run_all(engine)
    error = results["broken"]["error"]
    assert isinstance(error, AdapterLoadError)
    assert f"({broken.uid}) cannot be served" in str(error)
    assert "stored bytes changed since upload: adapter_model.safetensors" in str(error)
    assert not version_dir(broken).exists()  # the damaged copy is never loaded again
    for request_id in ("healthy", "base"):
        assert results[request_id]["error"] is None
        assert len(results[request_id]["tokens"]) == GREEDY.max_tokens
