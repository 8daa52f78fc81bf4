"""Bad input a caller can cause: a clear EngineError, and the engine keeps serving."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from inference.engine import (
    ConfigError,
    DuplicateRequestError,
    EngineConfig,
    EngineError,
    EngineRequest,
    InvalidRequestError,
    LLMEngine,
    ModelLoadError,
    PromptTooLongError,
    SamplingParams,
    SamplingParamsError,
)
from tests.tiny_llama import make_tiny_llama

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("tiny"), max_positions=64)


@pytest.fixture(scope="module")
def engine(model_dir):
    return LLMEngine(model=model_dir, block_size=4, kv_cache_bytes=1 << 20)


@pytest.fixture(scope="module")
def reference(engine):
    return engine.generate(["hello there"], GREEDY)[0].token_ids


@pytest.fixture
def still_serving(engine, reference):
    yield
    assert not engine.requests and engine.block_manager.num_used_blocks == 0
    assert engine.generate(["hello there"], GREEDY)[0].token_ids == reference


def test_prompt_longer_than_the_context_is_refused(engine, still_serving):
    with pytest.raises(PromptTooLongError, match="max_model_len"):
        engine.add_request(EngineRequest("long", prompt_token_ids=[5] * 64, sampling_params=GREEDY))
    # one token shorter leaves room for one generated token
    engine.add_request(EngineRequest("fits", prompt_token_ids=[5] * 63, sampling_params=GREEDY))
    [out] = [o for o in engine.step() if o.request_id == "fits"]
    assert out.finish_reason == "length" and out.completion_tokens == 1


def test_prompt_needing_more_blocks_than_the_whole_cache_is_refused(model_dir):
    block_bytes = EngineConfig(model=model_dir, block_size=4).kv_block_bytes
    small = LLMEngine(model=model_dir, block_size=4, kv_cache_bytes=5 * block_bytes)  # 20 tokens
    with pytest.raises(PromptTooLongError, match="KV cache"):
        small.add_request(EngineRequest("big", prompt_token_ids=[5] * 20, sampling_params=GREEDY))
    assert small.generate([[5] * 19], GREEDY)[0].finish_reason == "length"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_tokens": 0},
        {"max_tokens": -3},
        {"temperature": -0.5},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"top_k": 0},
        {"top_k": -2},
        {"logprobs": 21},
        {"logprobs": -1},
        {"stop": [""]},
        {"stop_token_ids": [-1]},
        {"seed": "abc"},
    ],
)
def test_bad_sampling_values_are_refused(kwargs):
    with pytest.raises(SamplingParamsError) as info:
        SamplingParams(**kwargs)
    assert next(iter(kwargs)) in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("prompt", "token_ids", "message"),
    [
        ("", None, "empty"),
        (None, [], "empty"),
        (None, None, "exactly one"),
        ("hi", [1, 2], "exactly one"),
        (None, [1, 100_000], "vocabulary"),
        (None, [1, -1], "vocabulary"),
        (42, None, "string"),
    ],
)
def test_bad_prompts_are_refused(engine, still_serving, prompt, token_ids, message):
    with pytest.raises(InvalidRequestError, match=message):
        engine.add_request(EngineRequest("bad", prompt, GREEDY, prompt_token_ids=token_ids))


def test_duplicate_request_id_is_refused(engine, still_serving):
    engine.add_request(EngineRequest("same", "hello", GREEDY))
    with pytest.raises(DuplicateRequestError, match="same"):
        engine.add_request(EngineRequest("same", "another", GREEDY))
    while engine.has_unfinished():
        engine.step()
    engine.add_request(EngineRequest("same", "again", GREEDY))  # free once finished
    while engine.has_unfinished():
        engine.step()


def test_missing_model_folder_is_a_load_error(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        LLMEngine(model=tmp_path / "nowhere")
    with pytest.raises(ModelLoadError, match="config.json is missing"):
        LLMEngine(model=tmp_path)


def _copy(model_dir, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(model_dir, folder)
    return folder


def _edit_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def test_unknown_architecture_is_a_load_error(model_dir, tmp_path):
    folder = _copy(model_dir, tmp_path)
    _edit_config(folder, architectures=["GPT2LMHeadModel"])
    with pytest.raises(ModelLoadError, match="GPT2LMHeadModel.*LlamaForCausalLM"):
        LLMEngine(model=folder)


def test_unsupported_rope_scaling_is_a_load_error(model_dir, tmp_path):
    folder = _copy(model_dir, tmp_path)
    _edit_config(folder, rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0})
    with pytest.raises(ModelLoadError, match="yarn"):
        LLMEngine(model=folder)


def test_corrupt_config_is_a_load_error(model_dir, tmp_path):
    folder = _copy(model_dir, tmp_path)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        LLMEngine(model=folder)


def _truncate_weights(folder):
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])


DROPPED = "layers.1.self_attn.k_proj.weight.*model.norm.weight"  # both named, in order


def _drop_tensors(folder):
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    del tensors["model.norm.weight"]
    save_file(tensors, folder / "model.safetensors")


def _delete(name):
    return lambda folder: (folder / name).unlink()


def _config(**changes):
    return lambda folder: _edit_config(folder, **changes)


# name -> (how the folder is spoiled, the error, words of its message)
BROKEN_FOLDERS = {
    "corrupt-weights": (_truncate_weights, ModelLoadError, "model.safetensors"),
    "missing-weights-file": (_delete("model.safetensors"), ModelLoadError, "no \\*.safetensors"),
    "missing-tensors-named": (_drop_tensors, ModelLoadError, DROPPED),
    "weights-disagree-shape": (_config(intermediate_size=96), ModelLoadError, "shape"),
    "weights-disagree-layers": (_config(num_hidden_layers=1), ModelLoadError, "layers.1"),
    "tokenizer-beyond-vocab": (_config(vocab_size=300), ModelLoadError, "tokenizer has 384 tokens"),
    "missing-tokenizer": (_delete("tokenizer.json"), EngineError, "tokenizer.json"),
}


@pytest.mark.parametrize(("spoil", "error", "words"), BROKEN_FOLDERS.values(), ids=BROKEN_FOLDERS)
def test_a_broken_model_folder_is_refused_at_load(model_dir, tmp_path, spoil, error, words):
    folder = _copy(model_dir, tmp_path)
    spoil(folder)
    with pytest.raises(error, match=words):
        LLMEngine(model=folder, kv_cache_bytes=1 << 20)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_model_len": 65}, "max_model_len"),
        ({"max_model_len": 64, "max_num_batched_tokens": 32}, "max_num_batched_tokens"),
        ({"kv_cache_bytes": 10}, "kv_cache_bytes"),
        ({"dtype": "int8"}, "dtype"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"device": "tpu"}, "device"),
        ({"device": "not a device"}, "device"),
    ],
)
def test_bad_engine_config_is_refused(model_dir, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        EngineConfig(model=model_dir, **kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_asking_for_cuda_without_cuda_is_refused(model_dir):
    with pytest.raises(ConfigError, match="no CUDA device"):
        EngineConfig(model=model_dir, device="cuda")
