"""Adapters the engine refuses, and bad LoRA input: a clear error naming the problem goes to
the requests for that adapter only, and the engine keeps serving everyone else."""

import asyncio
import threading

import pytest
import torch

from inference.engine import (
    AdapterLoadError,
    AsyncLLMEngine,
    ConfigError,
    EngineConfig,
    EngineRequest,
    InvalidRequestError,
    LLMEngine,
    LoRARequest,
)
from tests.engine.lora_fixtures import (
    GREEDY,
    corrupt,
    lora_engine,
    request_for,
    run_all,
)

KEY = "base_model.model.model.layers.{}.self_attn.{}.lora_{}.weight"
GOOD = {"rank": 4, "alpha": 8, "targets": ("q_proj", "k_proj", "v_proj", "o_proj")}


def _rename(old, new):
    def edit(w):
        for k in [k for k in w if old in k]:
            w[k.replace(old, new)] = w.pop(k)

    return edit


def _poison(w):
    w[KEY.format(1, "v_proj", "B")][3, 1] = float("nan")


# name -> (how to make it from the good adapter or with PEFT, words the error must contain)
REFUSED = {
    "dora_without_magnitudes": (
        {"config": {"use_dora": True}},
        "needs a lora_magnitude_vector per adapted module; "
        "none for model.layers.0.self_attn.k_proj",
    ),
    "lora_bias": ({"lora_bias": True}, "lora_bias"),
    "modules_to_save_norm": (
        {"modules_to_save": ["norm"]},
        "modules_to_save lists 'norm'; only embed_tokens and lm_head are served whole",
    ),
    "rank_above_max": ({"rank": 32, "alpha": 32}, "above this platform's maximum LoRA rank 16"),
    "unknown_module": (_rename("self_attn.k_proj", "mlp.fc1"), "has no such module"),
    "bad_shape": (
        lambda w: w.update({KEY.format(0, "k_proj", "B"): torch.zeros(64, 4)}),
        "is [64, 4], the base model needs [32, 4]",
    ),
    "layer_out_of_range": (_rename("layers.1.", "layers.7."), "found layer 7"),
    "nan": (_poison, "NaN or Inf"),
    "adapts_nothing": (lambda w: w.clear(), "would change nothing"),
    "missing_folder": (None, "does not exist"),
}


@pytest.fixture(scope="module")
def good(adapters):
    return request_for("good", adapters("good", **GOOD))


@pytest.fixture(scope="module")
def engine(lora_model_dir):
    engine = lora_engine(lora_model_dir, max_loras=2, max_lora_rank=16)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def reference(engine, good):
    outs = engine.generate(["hello there", "hello there"], GREEDY, lora_request=[None, good])
    assert outs[0].token_ids != outs[1].token_ids
    return {"base": outs[0].token_ids, "good": outs[1].token_ids}


def _bad_adapter(name, adapters, tmp_path):
    how, _ = REFUSED[name]
    if how is None:
        return tmp_path / "nowhere"
    if isinstance(how, dict) and "config" in how:
        return corrupt(
            adapters("good", **GOOD), tmp_path / name, config=lambda c: c.update(how["config"])
        )
    if isinstance(how, dict):
        return adapters(name, **(GOOD | how))
    return corrupt(adapters("good", **GOOD), tmp_path / name, tensors=how)


@pytest.mark.parametrize("name", list(REFUSED))
def test_refused_adapter_fails_only_its_requests(engine, reference, good, adapters, tmp_path, name):
    bad = request_for(name, _bad_adapter(name, adapters, tmp_path))
    failures = engine.stats()["lora"]["load_failures"]
    engine.add_request(EngineRequest("bad-1", "hello there", GREEDY, lora_request=bad))
    engine.add_request(EngineRequest("base", "hello there", GREEDY))
    engine.add_request(EngineRequest("bad-2", "hello there", GREEDY, lora_request=bad))
    engine.add_request(EngineRequest("good", "hello there", GREEDY, lora_request=good))
    results = run_all(engine)
    for rid in ("bad-1", "bad-2"):
        error = results[rid]["error"]
        assert results[rid]["finish"] == "abort" and results[rid]["tokens"] == []
        assert isinstance(error, AdapterLoadError), error
        assert REFUSED[name][1] in str(error) and f"adapter '{name}'" in str(error)
    assert results["base"]["tokens"] == reference["base"]
    assert results["good"]["tokens"] == reference["good"]
    assert results["base"]["error"] is None and results["good"]["error"] is None
    lora = engine.stats()["lora"]
    assert lora["load_failures"] == failures + 1  # one load for both requests
    assert bad.adapter_id not in {a["adapter_id"] for a in engine.list_loras()}
    assert not engine.requests and engine.block_manager.num_used_blocks == 0


def test_async_caller_gets_the_adapter_error_raised(lora_model_dir, adapters, tmp_path, good):
    bad = request_for("nan", corrupt(adapters("good", **GOOD), tmp_path / "nan", tensors=_poison))
    engine = AsyncLLMEngine(lora_engine(lora_model_dir, max_loras=2))

    async def collect(rid, lora):
        return [
            o
            async for o in engine.generate(
                EngineRequest(rid, "hello there", GREEDY, lora_request=lora)
            )
        ]

    async def main():
        with pytest.raises(AdapterLoadError, match=r"finite: weights contain NaN or Inf"):
            await collect("bad", bad)
        return await collect("fine", good)

    try:
        outs = asyncio.run(main())
        assert outs[-1].finish_reason == "length" and len(outs) == GREEDY.max_tokens
    finally:
        engine.shutdown()


def test_loader_failures_name_the_cause(lora_model_dir, adapters):
    calls = []

    def loader(req):
        calls.append(req.adapter_id)
        if req.adapter_id == "id-boom":
            raise ConnectionError("object storage is unreachable")
        if req.adapter_id == "id-odd":
            return "/no/such/folder"
        return adapters("good", **GOOD)

    engine = lora_engine(lora_model_dir, max_loras=2, lora_loader=loader)
    cases = {
        "boom": "the loader could not fetch it: object storage is unreachable",
        "odd": "the loader returned '/no/such/folder', which is not a folder",
        "fetched": None,
    }
    for name in cases:
        engine.add_request(
            EngineRequest(name, "hello", GREEDY, lora_request=LoRARequest(name, f"id-{name}"))
        )
    results = run_all(engine)
    for name, words in cases.items():
        if words is None:
            assert results[name]["finish"] == "length" and results[name]["error"] is None
        else:
            assert words in str(results[name]["error"])
    assert sorted(calls) == ["id-boom", "id-fetched", "id-odd", "id-odd"]  # odd: asked twice
    assert engine.stats()["lora"]["hits"]["loader"] == 1
    engine.close()


def test_a_folder_gone_when_looked_at_is_asked_for_again(lora_model_dir, adapters):
    """Another stager replacing the copy (removed, then renamed into place) leaves a moment
    with no folder: the loader is asked once more, and the request is served."""
    calls = []

    def loader(req):
        calls.append(req.adapter_id)
        return "/being/replaced" if len(calls) == 1 else adapters("good", **GOOD)

    engine = lora_engine(lora_model_dir, max_loras=2, lora_loader=loader)
    engine.add_request(EngineRequest("r", "hello", GREEDY, lora_request=LoRARequest("x", "id-x")))
    result = run_all(engine)["r"]
    assert result["error"] is None and result["finish"] == "length"
    assert calls == ["id-x", "id-x"]
    engine.close()


def test_no_path_and_no_loader_is_a_load_error(lora_model_dir):
    engine = lora_engine(lora_model_dir)
    engine.add_request(EngineRequest("r", "hello", GREEDY, lora_request=LoRARequest("x", "id-x")))
    assert "no loader" in str(run_all(engine)["r"]["error"])


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"name": "", "adapter_id": "a"}, "LoRARequest.name must be a non-empty string"),
        ({"name": "a", "adapter_id": 7}, "LoRARequest.adapter_id must be a non-empty string"),
        ({"name": "a", "adapter_id": "a", "path": 3}, "LoRARequest.path must be a folder path"),
    ],
)
def test_bad_lora_request_fields_are_refused(kwargs, words):
    with pytest.raises(InvalidRequestError, match=words):
        LoRARequest(**kwargs)


def test_lora_request_of_the_wrong_type_or_on_a_base_only_engine(lora_model_dir, engine):
    with pytest.raises(InvalidRequestError, match="must be a LoRARequest"):
        engine.add_request(EngineRequest("r", "hello", GREEDY, lora_request="my-adapter"))
    with pytest.raises(InvalidRequestError, match="fairness_key must be a string"):
        engine.add_request(EngineRequest("r", "hello", GREEDY, fairness_key=3))
    base_only = LLMEngine(model=lora_model_dir, kv_cache_bytes=1 << 20)
    with pytest.raises(InvalidRequestError, match="enable_lora"):
        base_only.add_request(
            EngineRequest("r", "hello", GREEDY, lora_request=LoRARequest("a", "a", "/x"))
        )
    with pytest.raises(InvalidRequestError, match="enable_lora"):
        base_only.list_loras()
    assert not engine.requests and not base_only.requests


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"max_loras": 0}, "max_loras must be a positive integer"),
        ({"max_lora_rank": -1}, "max_lora_rank must be a positive integer"),
        ({"max_loras": 8, "max_cpu_loras": 4}, "max_cpu_loras 4 must be at least max_loras 8"),
    ],
)
def test_bad_lora_settings_are_refused(lora_model_dir, kwargs, words):
    with pytest.raises(ConfigError, match=words):
        EngineConfig(model=lora_model_dir, enable_lora=True, **kwargs)


def test_slots_that_leave_no_room_for_the_kv_cache_are_refused(lora_model_dir):
    with pytest.raises(ConfigError, match="LoRA slots .* but no KV block"):
        LLMEngine(model=lora_model_dir, enable_lora=True, max_loras=64, kv_cache_bytes=1 << 20)


def test_lora_scratch_and_extras_shrink_the_pool_and_the_slots_live_in_it(lora_model_dir):
    plain = LLMEngine(model=lora_model_dir, kv_cache_bytes=4 << 20)
    with_lora = lora_engine(lora_model_dir, kv_cache_bytes=4 << 20, block_size=16, max_loras=8)
    slots = with_lora.model_runner.lora_slots
    block = with_lora.config.kv_block_bytes
    assert with_lora.block_manager.num_blocks == ((4 << 20) - slots.reserved_nbytes) // block
    assert with_lora.block_manager.num_blocks < plain.block_manager.num_blocks
    # the 8 slots' rows are pages of that pool, the bottom ones
    pool = with_lora.model_runner.kv_cache
    assert slots.num_slots == 8
    assert slots.weights.untyped_storage().data_ptr() == pool.untyped_storage().data_ptr()


def test_control_calls_name_the_problem(engine, good, reference):
    with pytest.raises(InvalidRequestError, match="not known to the engine"):
        engine.pin_lora("id-never-seen")
    assert engine.unload_lora("id-never-seen") is False
    engine.add_request(EngineRequest("busy", "hello there", GREEDY, lora_request=good))
    with pytest.raises(InvalidRequestError, match="in use by 1 request"):
        engine.unload_lora(good.adapter_id)
    assert run_all(engine)["busy"]["tokens"] == reference["good"]
    engine.pin_lora(good.adapter_id)
    other = LoRARequest("other", "id-other", good.path)
    engine.load_lora(other)
    run_all(engine)
    with pytest.raises(InvalidRequestError, match="one slot must stay free"):
        engine.pin_lora(other.adapter_id)  # max_loras is 2: one pinned is the most
    engine.pin_lora(good.adapter_id, pinned=False)
    assert engine.unload_lora(other.adapter_id) is True
    assert other.adapter_id not in {a["adapter_id"] for a in engine.list_loras()}


def test_a_loader_that_blocks_does_not_block_other_requests(lora_model_dir, good, reference):
    release = threading.Event()

    def slow_loader(req):
        release.wait(30)
        return good.path

    engine = lora_engine(lora_model_dir, max_loras=2, lora_loader=slow_loader)
    engine.add_request(
        EngineRequest("slow", "hello there", GREEDY, lora_request=LoRARequest("s", "id-s"))
    )
    engine.add_request(EngineRequest("base", "hello there", GREEDY))
    tokens = []
    while len(tokens) < GREEDY.max_tokens:  # the base request finishes while the load hangs
        tokens += [t for o in engine.step() if o.request_id == "base" for t in o.new_token_ids]
    assert tokens == reference["base"]
    assert engine.list_loras()[0]["loading"] and "slow" in engine.requests
    release.set()
    assert run_all(engine)["slow"]["tokens"] == reference["good"]
