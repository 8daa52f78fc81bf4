"""What only some adapters carry (DoRA scales, LoRA on embed_tokens / lm_head, saved heads)
in device and host memory: its own arena, waiting for room there instead of failing, limits
that refuse an adapter with a reason, and the host cache counting its bytes."""

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from inference.engine import AdapterLoadError, EngineRequest, SamplingParams
from tests.engine.lora_fixtures import corrupt, lora_engine, request_for, run_all

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
SAVED_HEAD = {"rank": 4, "alpha": 8, "targets": ("q_proj",), "modules_to_save": ["lm_head"]}
EMBED_LORA = {"rank": 4, "alpha": 8, "targets": ("embed_tokens", "v_proj")}
DORA = {"rank": 4, "alpha": 8, "targets": ("q_proj", "v_proj"), "use_dora": True}
BASE_COPY = "base_model.model.model.embed_tokens.base_layer.weight"
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
PROMPT = list(range(30, 42))


def head_bytes(engine) -> int:
    mc = engine.config.model_config
    return mc.vocab_size * mc.hidden_size * engine.config.torch_dtype.itemsize


def peft_greedy(model_dir, adapter_dir, prompt=PROMPT, n=GREEDY.max_tokens) -> list[int]:
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), adapter_dir)
    out = model.eval().generate(
        input_ids=torch.tensor([prompt]),
        max_new_tokens=n,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


def load_error(engine, request) -> str:
    engine.add_request(
        EngineRequest("r", prompt_token_ids=PROMPT, sampling_params=GREEDY, lora_request=request)
    )
    result = run_all(engine)["r"]
    assert isinstance(result["error"], AdapterLoadError) and result["tokens"] == []
    return str(result["error"])


def test_a_saved_head_above_the_limit_fails_its_requests(lora_model_dir, adapters):
    engine = lora_engine(lora_model_dir, max_loras=2, max_saved_module_params=1000)
    message = load_error(engine, request_for("head", adapters("saved-head", **SAVED_HEAD)))
    assert "own lm_head has 24,576 parameters, above this platform's limit of 1,000" in message


def test_an_unchanged_base_layer_copy_costs_nothing_whatever_its_size(lora_model_dir, adapters):
    """PEFT saves the embedding next to LoRA on it; equal to the served one, it is dropped."""
    engine = lora_engine(lora_model_dir, max_loras=2, max_saved_module_params=1000)
    folder = adapters("embed-lora", **EMBED_LORA)
    [out] = engine.generate([PROMPT], GREEDY, lora_request=request_for("embed", folder))
    assert out.error is None and out.token_ids == peft_greedy(lora_model_dir, folder)
    [entry] = engine.lora_manager.adapters.values()
    mc = engine.config.model_config
    assert entry.host.extras.numel == (mc.vocab_size + mc.hidden_size) * 4  # factors, no copy


def test_a_changed_base_layer_copy_above_the_limit_is_refused(lora_model_dir, adapters, tmp_path):
    changed = corrupt(
        adapters("embed-lora", **EMBED_LORA),
        tmp_path / "changed",
        tensors=lambda w: w[BASE_COPY].add_(0.01),
    )
    engine = lora_engine(lora_model_dir, max_loras=2, max_saved_module_params=1000)
    message = load_error(engine, request_for("changed", changed))
    assert "its copy of the base model's embed_tokens differs from the served weights" in message
    assert "save_embedding_layers=False" in message


def test_extras_larger_than_the_reserved_memory_fail_at_load(lora_model_dir, adapters):
    engine = lora_engine(lora_model_dir, max_loras=2, lora_extra_bytes=1000)
    assert engine.model_runner.lora_slots.arena.nbytes == 1000
    message = load_error(engine, request_for("dora", adapters("dora", **DORA)))
    assert (
        "more than the 1,000 this engine reserves for them (LORAPLEX_LORA_EXTRA_BYTES)" in message
    )


def test_adapters_wait_for_room_for_their_extras_and_evict_idle_ones(lora_model_dir, adapters):
    """Room for one saved head: two adapters with one each take turns, a plain adapter and
    the base model run beside them all along, and every output is PEFT's."""
    first = adapters("saved-head", **SAVED_HEAD)
    second = adapters("saved-head-2", **SAVED_HEAD, seed=7)
    plain = adapters("plain-qv", rank=8, alpha=16, targets=("q_proj", "v_proj"))
    probe = lora_engine(lora_model_dir, max_loras=2)
    engine = lora_engine(lora_model_dir, max_loras=4, lora_extra_bytes=head_bytes(probe))
    loras = {
        "first": request_for("first", first),
        "second": request_for("second", second),
        "plain": request_for("plain", plain),
        "base": None,
    }
    for rid, lora in loras.items():
        engine.add_request(
            EngineRequest(rid, prompt_token_ids=PROMPT, sampling_params=GREEDY, lora_request=lora)
        )
    together = []
    results: dict[str, list[int]] = {rid: [] for rid in loras}
    while engine.has_unfinished():
        for out in engine.step():
            assert out.error is None
            results[out.request_id] += out.new_token_ids
        together.append(set(engine.stats()["lora"]["running_adapters"]))
        engine.wait_for_load(0.01)
    assert not any({"first", "second"} <= names for names in together)
    assert any({"plain", "first"} <= names or {"plain", "second"} <= names for names in together)
    for rid, folder in (("first", first), ("second", second), ("plain", plain)):
        assert results[rid] == peft_greedy(lora_model_dir, folder), rid
    lora = engine.stats()["lora"]
    assert lora["evictions"]["device"] >= 1  # the idle head made room for the other
    assert lora["extras_bytes_used"] == head_bytes(engine)


def test_the_host_cache_counts_extras_bytes(lora_model_dir, adapters):
    """Host memory holds, per slot, as many extras bytes as the device arena: two adapters
    with a saved head do not both stay cached when the arena holds one."""
    probe = lora_engine(lora_model_dir, max_loras=2)
    engine = lora_engine(
        lora_model_dir, max_loras=2, max_cpu_loras=2, lora_extra_bytes=head_bytes(probe)
    )
    row = engine.model_runner.lora_slots.row_nbytes
    for name, seed in (("a", 3), ("b", 4)):
        future = engine.load_lora(
            request_for(name, adapters(f"head-{name}", **SAVED_HEAD, seed=seed))
        )
        while not future.done():
            engine.step()
            engine.wait_for_load(0.05)
        assert future.result() is None
    tiers = {a["name"]: a["tier"] for a in engine.list_loras()}
    assert tiers == {"a": "disk", "b": "host"}  # a, least recently loaded, made room
    assert engine.stats()["lora"]["host_bytes"] == row + head_bytes(engine)


def test_pinned_extras_that_fill_the_arena_stall_only_the_adapters_that_need_room(
    lora_model_dir, adapters
):
    """The arena holds one saved head and a pinned adapter has it: another adapter with a
    saved head waits until the pin is lifted, and nobody else waits for it."""
    pinned = request_for("pinned", adapters("saved-head", **SAVED_HEAD))
    other = request_for("other", adapters("saved-head-2", **SAVED_HEAD, seed=7))
    plain = request_for(
        "plain", adapters("plain-qv", rank=8, alpha=16, targets=("q_proj", "v_proj"))
    )
    probe = lora_engine(lora_model_dir, max_loras=2)
    engine = lora_engine(lora_model_dir, max_loras=4, lora_extra_bytes=head_bytes(probe))
    future = engine.load_lora(pinned, pin=True)
    while not future.done():
        engine.step()
        engine.wait_for_load(0.05)
    for rid, lora in (("other", other), ("plain", plain), ("base", None)):
        engine.add_request(
            EngineRequest(rid, prompt_token_ids=PROMPT, sampling_params=GREEDY, lora_request=lora)
        )
    finished = set()
    for _ in range(200):
        finished |= {o.request_id for o in engine.step() if o.finished}
        engine.wait_for_load(0.01)
        if {"plain", "base"} <= finished:
            break
    assert finished == {"plain", "base"}  # "other" still waits for arena room
    engine.pin_lora(pinned.adapter_id, False)
    results = run_all(engine)
    assert results["other"]["error"] is None
    assert results["other"]["tokens"] == peft_greedy(
        lora_model_dir, adapters("saved-head-2", **SAVED_HEAD, seed=7)
    )
