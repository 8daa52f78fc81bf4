"""The adapters of waiting and running requests, by the name each client asked for (what a
LoRA-aware router matches requests on), in the engine's LoRA stats."""

import pytest

from inference.engine import EngineRequest, InvalidRequestError, SamplingParams
from tests.engine.lora_fixtures import lora_engine, request_for, run_all

LONG = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture
def engine(lora_model_dir):
    engine = lora_engine(lora_model_dir, max_loras=2, max_cpu_loras=2)
    yield engine
    engine.close()


def names(engine) -> tuple[list[str], list[str]]:
    lora = engine.stats()["lora"]
    return lora["running_model_names"], lora["waiting_model_names"]


def test_each_request_is_named_as_its_client_asked(engine, adapters):
    adapter = request_for("acme/bot:1", adapters("bot", rank=4, targets=("q_proj",)))
    for request_id, model_name in (("r1", "bot"), ("r2", "bot@canary"), ("r3", None)):
        engine.add_request(
            EngineRequest(request_id, "hello", LONG, lora_request=adapter, model_name=model_name)
        )
    engine.add_request(EngineRequest("base", "hello", LONG))  # no adapter: not named
    # r3 sent no name: the adapter's own stands in
    assert names(engine) == ([], ["acme/bot:1", "bot", "bot@canary"])
    for _ in range(10_000):  # until the load lands and all three are admitted
        if names(engine)[1] == []:
            break
        steps = engine.num_steps
        engine.step()
        if engine.num_steps == steps:
            engine.wait_for_load(0.05)
    assert names(engine) == (["acme/bot:1", "bot", "bot@canary"], [])
    assert engine.stats()["lora"]["running_adapters"] == ["acme/bot:1"]  # one adapter
    results = run_all(engine)
    assert all(r["error"] is None for r in results.values())
    assert names(engine) == ([], [])


@pytest.mark.parametrize("model_name", ["", 5, b"bot"])
def test_a_model_name_that_is_not_a_string_is_refused(engine, model_name):
    with pytest.raises(InvalidRequestError, match="model_name must be a non-empty string"):
        engine.add_request(EngineRequest("r", "hello", LONG, model_name=model_name))
