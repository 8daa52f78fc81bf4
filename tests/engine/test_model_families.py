"""Every served family's forward pass against transformers on the same random weights.

Each tiny model (tests/tiny_models.py) turns on what sets its family apart; prompts of mixed
lengths run in one batch, several of them longer than the sliding window (8 tokens, 24 for
Phi-3), and every decode step is compared, once with the decode keys gathered afresh, once
from the kept buffers, and once with prompts split into chunks over the paged cache.
"""

import pytest
import torch
from transformers import AutoModelForCausalLM

from inference.engine import EngineRequest, LLMEngine, SamplingParams
from inference.engine.config import ModelConfig
from tests.engine.stepping import step_logits
from tests.tiny_models import make_tiny_model

FAMILIES = ["mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3"]
PROMPT_LENGTHS = (1, 5, 13, 20)  # with 6 decode steps: within Phi-3's original 32 positions
DECODE_STEPS = 6


@pytest.fixture(scope="module", params=FAMILIES)
def family_dir(request, tmp_path_factory):
    return request.param, make_tiny_model(tmp_path_factory.mktemp(request.param), request.param)


def _hf(folder):
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def _hf_next_logits(hf, token_ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([token_ids])).logits[0, -1]


def _compare_steps(
    engine: LLMEngine, hf, prompts: list[list[int]], steps: int, tag: str = "r"
) -> float:
    """Feed the prompts, then compare each step's logits; returns the largest error."""
    params = SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True)
    for i, ids in enumerate(prompts):
        engine.add_request(EngineRequest(f"{tag}{i}", prompt_token_ids=ids, sampling_params=params))
    worst = 0.0
    compared = 0
    while compared < steps * len(prompts):
        for seq, row in step_logits(engine):
            expected = _hf_next_logits(hf, seq.token_ids)
            torch.testing.assert_close(row, expected, atol=1e-4, rtol=0)
            worst = max(worst, float((row - expected).abs().max()))
            seq.token_ids.append(int(expected.argmax()))
            compared += 1
    return worst


@pytest.mark.parametrize("mode", ["gathered", "buffered", "chunked"])
def test_logits_match_transformers_past_the_window(family_dir, mode):
    family, folder = family_dir
    hf = _hf(folder)
    kwargs = {}
    if mode == "chunked":  # prompts split over steps: later chunks read the paged cache
        kwargs = {"max_num_batched_tokens": 7, "max_num_seqs": 4}
    engine = LLMEngine(model=folder, block_size=4, kv_cache_bytes=1 << 20, **kwargs)
    if mode == "buffered":
        engine.model_runner.input_builder.decode_buffers.headroom = 2
    else:
        engine.model_runner.input_builder.decode_buffers.budget_bytes = 0
    torch.manual_seed(1)
    prompts = [torch.randint(3, 384, (n,)).tolist() for n in PROMPT_LENGTHS]
    _compare_steps(engine, hf, prompts, DECODE_STEPS)


def test_phi3_longrope_switches_factors_where_transformers_does(tmp_path):
    """Prompts longer than the original 32 positions rotate with the long factors
    throughout; a shorter one with the short factors until it grows past 32 tokens, when
    transformers' generate recomputes it with the long ones: each step's logits equal
    generate's."""
    folder = make_tiny_model(tmp_path, "phi3")
    hf = _hf(folder)
    engine = LLMEngine(model=folder, block_size=4, kv_cache_bytes=1 << 20)
    assert engine.config.max_model_len == 128
    torch.manual_seed(2)
    long_prompts = [torch.randint(3, 384, (n,)).tolist() for n in (33, 45)]
    crossing = torch.randint(3, 384, (28,)).tolist()
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    engine.add_request(EngineRequest("cross", prompt_token_ids=crossing, sampling_params=params))
    _compare_steps(engine, hf, long_prompts, 4, tag="long")  # steps "cross" alongside
    [cross] = [s for s in engine.scheduler.running if s.request_id == "cross"]
    assert len(cross) <= 32 and engine.abort("long0") and engine.abort("long1")
    with torch.no_grad():
        generated = hf.generate(
            torch.tensor([crossing]),
            max_new_tokens=len(cross) - len(crossing) + 6,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            output_logits=True,
            return_dict_in_generate=True,
        )
    assert cross.token_ids == generated.sequences[0, : len(cross)].tolist()
    for _ in range(6):  # on past position 32
        [(seq, row)] = step_logits(engine)
        expected = generated.logits[len(seq) - len(crossing)][0]
        torch.testing.assert_close(row, expected, atol=1e-4, rtol=0)
        seq.token_ids.append(int(expected.argmax()))
    # crossing position 32 recomputed the sequence (transformers' generate does the same)
    assert cross.num_preemptions == 1 and cross.cached_long_rope is True


def test_prefix_cache_hit_past_the_window_matches_transformers(tmp_path):
    """A cached prefix longer than the window: the new tokens attend only within it."""
    folder = make_tiny_model(tmp_path, "gemma2")
    hf = _hf(folder)
    engine = LLMEngine(model=folder, block_size=4, kv_cache_bytes=1 << 20)
    torch.manual_seed(3)
    shared = torch.randint(3, 384, (16,)).tolist()
    _compare_steps(engine, hf, [shared + [5, 6]], 2)
    before = engine.scheduler.block_manager.stats.hits
    _compare_steps(engine, hf, [shared + [7, 8, 9]], 3, tag="again")
    assert engine.scheduler.block_manager.stats.hits > before


def test_generation_matches_transformers_greedy(family_dir):
    family, folder = family_dir
    hf = _hf(folder)
    engine = LLMEngine(model=folder, kv_cache_bytes=1 << 20, max_model_len=32)  # no LongRoPE switch
    prompt = engine.tokenizer.encode("The quick brown fox")
    params = SamplingParams(temperature=0, max_tokens=32 - len(prompt), ignore_eos=True)
    [out] = engine.generate([prompt], params)
    expected = hf.generate(
        torch.tensor([prompt]),
        max_new_tokens=params.max_tokens,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )[0, len(prompt) :].tolist()
    assert out.token_ids == expected


def test_family_switches_are_read_from_config(family_dir):
    family, folder = family_dir
    mc = ModelConfig.from_folder(folder)
    assert mc.family == family
    windows = {
        "mistral": (8, 8),
        "qwen2": (None, 8),
        "qwen3": (None, None),
        "gemma2": (8, None),
        "gemma3": (8, None),
        "phi3": (24, 24),
    }
    assert mc.layer_windows == windows[family]
    assert mc.qkv_bias == (family == "qwen2")
    assert mc.qk_norm == (family in ("qwen3", "gemma3"))
    assert (mc.norm_offset == 1.0) == (mc.embed_scale is not None) == family.startswith("gemma")
    assert (mc.attn_softcap, mc.final_softcap) == (
        (4.0, 6.0) if family == "gemma2" else (None, None)
    )
    assert (mc.local_rope is not None) == (family == "gemma3")


def test_partial_rotary_phi_matches_transformers(tmp_path):
    """Phi-4-mini style: only the first half of each head rotates."""
    rope = {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5,
        "short_factor": [1.0, 1.5, 2.0, 2.5],
        "long_factor": [1.0, 3.0, 5.0, 7.0],
    }
    folder = make_tiny_model(tmp_path, "phi3", rope_parameters=rope)
    assert ModelConfig.from_folder(folder).rotary_dim == 8
    engine = LLMEngine(model=folder, block_size=4, kv_cache_bytes=1 << 20, max_model_len=32)
    torch.manual_seed(4)
    prompts = [torch.randint(3, 384, (n,)).tolist() for n in (3, 11)]
    _compare_steps(engine, _hf(folder), prompts, 4)


BAD_CONFIGS = {
    "activation": ({"hidden_act": "relu"}, "activation 'relu' is not supported"),
    "layer_types": ({"layer_types": ["full_attention"]}, "layer_types must list 2"),
    "window": (
        {"layer_types": ["sliding_attention"] * 2, "sliding_window": 0},
        "sliding layers need a positive integer sliding_window",
    ),
    "softcap": ({"attn_logit_softcapping": -1}, "attn_logit_softcapping must be a positive"),
    "longrope_factors": (
        {
            "rope_scaling": {"rope_type": "longrope", "short_factor": [1.0], "long_factor": [1.0]},
            "original_max_position_embeddings": 8,
        },
        "longrope short_factor must list 8 positive numbers",
    ),
    "partial_rotary": ({"partial_rotary_factor": 0.1}, "partial_rotary_factor 0.1 leaves 1 of 16"),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_bad_family_configs_are_refused_with_the_reason(case):
    from inference.engine.errors import ModelLoadError

    changes, message = BAD_CONFIGS[case]
    raw = {
        "architectures": ["Qwen2ForCausalLM"],
        "vocab_size": 100,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        **changes,
    }
    with pytest.raises(ModelLoadError, match=message):
        ModelConfig.from_dict(raw)


def test_blocks_behind_the_window_are_let_go_while_decoding(tmp_path):
    """Mistral (every layer slides, window 8, blocks of 4): a sequence holds about three
    blocks however long it grows, and its logits still equal transformers'."""
    folder = make_tiny_model(tmp_path, "mistral")
    engine = LLMEngine(model=folder, block_size=4, kv_cache_bytes=1 << 20)
    assert engine.block_manager.sliding_window == 8
    torch.manual_seed(5)
    prompt = torch.randint(3, 384, (30,)).tolist()
    _compare_steps(engine, _hf(folder), [prompt], 10)
    [seq] = engine.scheduler.running
    held = [b for b in seq.block_table if b >= 0]
    assert len(seq.block_table) == 10 and len(held) <= 3  # 40 tokens, window 8
    assert engine.block_manager.num_used_blocks == len(held)
    engine.abort("r0")
    engine.step()
    assert engine.block_manager.num_used_blocks == 0


def test_blocks_stay_held_where_some_layers_attend_globally(tmp_path):
    folder = make_tiny_model(tmp_path, "gemma2")
    engine = LLMEngine(model=folder, block_size=4, kv_cache_bytes=1 << 20)
    assert engine.block_manager.sliding_window is None
    prompt = list(range(3, 33))
    _compare_steps(engine, _hf(folder), [prompt], 2)
    [seq] = engine.scheduler.running
    assert all(b >= 0 for b in seq.block_table)


BASE_RAW = {
    "vocab_size": 100,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
}
OLD_LAYOUTS = {  # configs as the hub's checkpoints were saved before transformers 5
    "gemma2": (
        {"architectures": ["Gemma2ForCausalLM"], "sliding_window": 4096},
        (4096, None, 4096, None, 4096, None),
    ),
    "gemma3": (
        {
            "architectures": ["Gemma3ForCausalLM"],
            "sliding_window": 512,
            "sliding_window_pattern": 3,
            "rope_theta": 1e6,
            "rope_local_base_freq": 1e4,
        },
        (512, 512, None, 512, 512, None),
    ),
    "qwen2": (
        {
            "architectures": ["Qwen2ForCausalLM"],
            "use_sliding_window": False,
            "sliding_window": 32768,
            "max_window_layers": 2,
        },
        (None,) * 6,
    ),
    "mistral": ({"architectures": ["MistralForCausalLM"], "sliding_window": 4096}, (4096,) * 6),
}


@pytest.mark.parametrize("family", list(OLD_LAYOUTS))
def test_older_config_layouts_give_the_same_switches(family):
    raw, windows = OLD_LAYOUTS[family]
    mc = ModelConfig.from_dict(BASE_RAW | raw)
    assert mc.layer_windows == windows
    if family == "gemma3":
        assert mc.layer_rope(0) == (1e4, None) and mc.layer_rope(2) == (1e6, None)


def test_early_phi3_su_rope_is_longrope():
    raw = BASE_RAW | {
        "architectures": ["Phi3ForCausalLM"],
        "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096,
        "rope_scaling": {"type": "su", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8},
    }
    scaling = ModelConfig.from_dict(raw).rope_scaling
    assert scaling is not None and scaling["rope_type"] == "longrope"
    assert scaling["attention_factor"] == pytest.approx(
        1.1902, abs=1e-4
    )  # sqrt(1 + ln 32 / ln 4096)


@pytest.mark.parametrize(
    "setting", [{"lora_extra_bytes": -1}, {"max_saved_module_params": 0}, {"lora_extra_bytes": "1"}]
)
def test_bad_lora_memory_settings_are_refused(tmp_path, setting):
    from inference.engine.config import EngineConfig
    from inference.engine.errors import ConfigError

    folder = make_tiny_model(tmp_path, "qwen2")
    with pytest.raises(ConfigError, match=next(iter(setting))):
        EngineConfig(model=folder, **setting)
