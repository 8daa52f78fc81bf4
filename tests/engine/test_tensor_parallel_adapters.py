"""Tensor parallelism's other ranks load their adapter shards with rank 0's load and hold
them as long as rank 0 does (inference/engine/parallel_adapters.py), on CPU with gloo.

Before, rank 1 read an adapter's folder only when its first slot write arrived, inside a
step: a folder the disk cache had evicted meanwhile made rank 1 die, and the engine with
it. Now a folder gone after the load changes nothing, and one gone during the load fails
that adapter's requests alone."""

import shutil

import pytest
import torch

from inference.engine import EngineRequest, SamplingParams
from inference.engine.errors import AdapterLoadError
from inference.engine.parallel_adapters import WorkerAdapters
from tests.engine.lora_fixtures import ATTENTION, lora_engine, request_for, run_all

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def tp_engine(lora_model_dir):
    engine = lora_engine(
        lora_model_dir, max_loras=2, max_cpu_loras=4, max_lora_rank=8, tensor_parallel_size=2
    )
    yield engine
    engine.close()


def copy_of(adapters, name: str, tmp_path):
    """A private copy of a session adapter, which a test may delete."""
    return shutil.copytree(adapters(name, rank=4, alpha=8, targets=ATTENTION), tmp_path / name)


def load(engine, request):
    future = engine.load_lora(request)
    while not future.done():
        engine.step()
        engine.wait_for_load(0.05)
    return future


def generate(engine, request_id: str, lora_request) -> dict:
    engine.add_request(EngineRequest(request_id, "Paris is", GREEDY, lora_request=lora_request))
    return run_all(engine)[request_id]


def test_a_folder_evicted_after_the_load_is_never_read_again(tp_engine, adapters, tmp_path):
    folder = copy_of(adapters, "evicted-after", tmp_path)
    request = request_for("evicted-after", folder)
    assert load(tp_engine, request).result() is None  # every rank holds its shard now
    shutil.rmtree(folder)  # the disk cache evicted it (before: rank 1 read it in the step)
    result = generate(tp_engine, "after-eviction", request)
    assert result["error"] is None and len(result["tokens"]) == GREEDY.max_tokens
    tp_engine.model_runner.check_ranks()  # no rank lost


def test_a_folder_gone_before_rank_1_reads_it_fails_that_adapter_alone(
    tp_engine, adapters, tmp_path, monkeypatch
):
    folder = copy_of(adapters, "evicted-during", tmp_path)
    ranks = tp_engine.lora_manager.loader.ranks
    real_load = ranks.load

    def evicted_between_the_ranks(request, path):
        shutil.rmtree(path)  # rank 0 has read it; the cache evicts it before rank 1 does
        return real_load(request, path)

    monkeypatch.setattr(ranks, "load", evicted_between_the_ranks)
    tp_engine.add_request(
        EngineRequest("doomed", "Paris is", GREEDY, lora_request=request_for("gone", folder))
    )
    tp_engine.add_request(EngineRequest("base", "Paris is", GREEDY))
    results = run_all(tp_engine)
    assert isinstance(results["doomed"]["error"], AdapterLoadError)
    assert "tensor-parallel rank 1 could not load it" in str(results["doomed"]["error"])
    assert "adapter_config.json is missing" in str(results["doomed"]["error"])
    assert results["base"]["error"] is None
    monkeypatch.undo()
    tp_engine.model_runner.check_ranks()  # the engine lives on, and serves the next load
    fresh = copy_of(adapters, "evicted-during", tmp_path / "again")
    result = generate(tp_engine, "retried", request_for("gone", fresh))
    assert result["error"] is None and len(result["tokens"]) == GREEDY.max_tokens


def test_slot_churn_after_the_folders_are_gone_keeps_every_answer(tp_engine, adapters, tmp_path):
    """Three adapters through two slots, their folders deleted once loaded: every swap-in
    on rank 1 comes from its held copy, and answers match the ones given before."""
    names = ["churn-a", "churn-b", "churn-c"]
    requests = {n: request_for(n, copy_of(adapters, n, tmp_path)) for n in names}
    before = {n: generate(tp_engine, f"{n}-1", r)["tokens"] for n, r in requests.items()}
    for request in requests.values():
        shutil.rmtree(request.path)
    for round_ in range(2):
        for name, request in requests.items():
            result = generate(tp_engine, f"{name}-{round_}-2", request)
            assert result["error"] is None
            assert result["tokens"] == before[name]
    tp_engine.model_runner.check_ranks()


class FakeSlots:
    device = torch.device("cpu")


def test_a_worker_holds_a_copy_as_many_times_as_rank_0_does(monkeypatch):
    loads = []

    def fake_load(slots, request, path, fingerprint, *, pin):
        loads.append(path)
        return object()

    monkeypatch.setattr("inference.engine.parallel_adapters.load_host_adapter", fake_load)
    config = type("Config", (), {"model_config": type("MC", (), {"fingerprint": None})()})()
    held = WorkerAdapters(FakeSlots(), config)  # type: ignore[arg-type]
    request = request_for("x", "/x")
    held.hold(request, "/x")
    held.hold(request, "/x")  # rank 0 loaded it again before its first copy was released
    assert loads == ["/x"] and held.num_held == 1
    held.release(["x-unknown", request.adapter_id])
    assert held.num_held == 1  # one of rank 0's copies still lives
    copy = held.copy_of(request, "/x")
    held.release([request.adapter_id])
    assert held.num_held == 0 and loads == ["/x"]
    assert held.copy_of(request, "/x") is not copy  # not held: read again, as a last resort
    assert loads == ["/x", "/x"]
