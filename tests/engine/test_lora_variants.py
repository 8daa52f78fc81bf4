"""PEFT's LoRA variants served exactly, on four families: per-module rank and alpha
(rank_pattern / alpha_pattern), DoRA, LoRA on embed_tokens and lm_head (tied on the tiny
Llama and Gemma 2, whose embedding is scaled; untied on Qwen2, whose q/k/v have biases, and
Phi-3), whole saved heads (modules_to_save), and Phi-3's fused qkv_proj / gate_up_proj
names. The engine's logits equal PEFT's own (fp32, 1e-4) at prefill and at each decode
step, for each adapter alone and all of them in one batch with a plain LoRA adapter and
base-model requests."""

import re
import warnings
from typing import Any

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from inference.engine import EngineRequest, SamplingParams
from tests.engine.lora_fixtures import ALL_LINEAR, lora_engine, request_for
from tests.engine.stepping import step_logits
from tests.peft_adapters import WEIGHTS_FILE, make_peft_adapter
from tests.tiny_llama import make_tiny_llama
from tests.tiny_models import make_tiny_model

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # PEFT's notes on tied heads

FAMILIES = ("llama", "qwen2", "gemma2", "phi3")
PLAIN = {"rank": 8, "alpha": 16, "targets": ("q_proj", "v_proj")}
VARIANTS = {
    "patterns": {
        "rank": 4,
        "alpha": 8,
        "targets": ALL_LINEAR,
        "rank_pattern": {"v_proj": 8, r"layers\.1\..*down_proj": 2},
        "alpha_pattern": {"^model.layers.0.self_attn.q_proj": 3, "up_proj": 20},
    },
    "dora": {"rank": 4, "alpha": 8, "targets": ALL_LINEAR, "use_dora": True},
    "embed_tokens": {"rank": 4, "alpha": 8, "targets": ("embed_tokens", "q_proj")},
    "lm_head": {"rank": 4, "alpha": 8, "targets": ("lm_head", "v_proj")},
    "heads_dora": {
        "rank": 4,
        "alpha": 8,
        "targets": ("embed_tokens", "lm_head", "o_proj"),
        "use_dora": True,
        "rank_pattern": {"lm_head": 2},
    },
    "saved_lm_head": {
        "rank": 4,
        "alpha": 8,
        "targets": ("q_proj",),
        "modules_to_save": ["lm_head"],
    },
    "saved_embed": {
        "rank": 4,
        "alpha": 8,
        "targets": ("q_proj",),
        "modules_to_save": ["embed_tokens"],
    },
    # a tied model's saved embedding is saved for lm_head too (the same copy)
    "saved_tied": {
        "rank": 4,
        "alpha": 8,
        "targets": ("k_proj",),
        "modules_to_save": ["embed_tokens"],
        "ensure_weight_tying": True,
    },
    # LoRA on embed_tokens with the base_layer copy PEFT saves, changed: PEFT loads it into
    # the model (into both heads when they are tied), so the engine serves it as the
    # adapter's own embedding
    "changed_base_copy": {"rank": 4, "alpha": 8, "targets": ("embed_tokens", "o_proj")},
}
CHANGED_COPY = "base_model.model.model.embed_tokens.base_layer.weight"
FUSED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj"} | {
    "gate_proj": "gate_up_proj",
    "up_proj": "gate_up_proj",
}
ATOL = 1e-4
MAX_ERRORS: dict[str, float] = {}  # (family, variant) -> largest |engine - PEFT| seen


def for_family(family: str, kwargs: dict) -> dict:
    """Phi-3 adapters name the fused modules, as PEFT does for a Phi-3 base."""
    if family != "phi3":
        return kwargs
    targets = tuple(dict.fromkeys(FUSED.get(t, t) for t in kwargs["targets"]))
    patterns = {
        k: {
            re.sub(r"\b(q|k|v)_proj", "qkv_proj", re.sub(r"\bup_proj", "gate_up_proj", key)): v
            for key, v in p.items()
        }
        for k, p in kwargs.items()
        if k.endswith("_pattern")
    }
    return kwargs | {"targets": targets} | patterns


class Family:
    """A tiny base model of one family, PEFT adapters for it, PEFT's models and an engine."""

    def __init__(self, family: str, root):
        self.name = family
        if family == "llama":
            self.base = make_tiny_llama(root / "base", num_layers=2)  # tied embeddings
        elif family == "phi3":  # LoRA does not care for LongRoPE, whose factor jumps at 32
            rope = {"rope_type": "default", "rope_theta": 10000.0}
            self.base = make_tiny_model(root / "base", family, rope_parameters=rope)
        else:
            self.base = make_tiny_model(root / "base", family)
        specs = {"plain": PLAIN} | VARIANTS
        self.dirs = {
            name: make_peft_adapter(self.base, root / name, seed=i + 1, **for_family(family, kw))
            for i, (name, kw) in enumerate(specs.items())
        }
        change_base_copy(self.dirs["changed_base_copy"] / WEIGHTS_FILE)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.peft: dict[str | None, Any] = {
                None: AutoModelForCausalLM.from_pretrained(self.base).eval()
            }
            for name, folder in self.dirs.items():
                base = AutoModelForCausalLM.from_pretrained(self.base)
                self.peft[name] = PeftModel.from_pretrained(base, folder).eval()
        self.requests = {name: request_for(name, folder) for name, folder in self.dirs.items()}
        self.engine = lora_engine(  # every prompt in one step: a budget that holds them all
            self.base, max_loras=len(self.dirs), max_lora_rank=16, max_num_batched_tokens=512
        )
        futures = [self.engine.load_lora(r) for r in self.requests.values()]
        while not all(f.done() for f in futures):
            self.engine.step()
            self.engine.wait_for_load(0.05)
        assert [f.result() for f in futures] == [None] * len(futures)

    def next_logits(self, adapter: str | None, token_ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return self.peft[adapter](torch.tensor([token_ids])).logits[0, -1]

    def run_against_peft(self, adapters: list[str | None], lengths: list[int], steps: int) -> None:
        """Requests for `adapters` (None: the base) in one batch; every step's logits of
        each must equal PEFT's. The first step is their prefill, the rest decodes."""
        params = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
        generator = torch.Generator().manual_seed(len(adapters))
        rids = {}
        for i, (name, n) in enumerate(zip(adapters, lengths, strict=True)):
            rid = f"{name}-{len(adapters)}-{i}"
            ids = torch.randint(3, 384, (n,), generator=generator).tolist()
            request = self.requests.get(name) if name is not None else None
            self.engine.add_request(
                EngineRequest(
                    rid, prompt_token_ids=ids, sampling_params=params, lora_request=request
                )
            )
            rids[rid] = name
        try:
            for _ in range(steps):
                rows = step_logits(self.engine)
                assert sorted(s.request_id for s, _ in rows) == sorted(rids)  # one batch
                for seq, row in rows:
                    name = rids[seq.request_id]
                    expected = self.next_logits(name, seq.token_ids)
                    error = (row - expected).abs().max().item()
                    key = f"{self.name}/{name or 'base'}"
                    MAX_ERRORS[key] = max(MAX_ERRORS.get(key, 0.0), error)
                    torch.testing.assert_close(row, expected, atol=ATOL, rtol=0, msg=key)
                    seq.token_ids.append(int(expected.argmax()))
        finally:
            for rid in rids:
                self.engine.abort(rid)


def change_base_copy(weights_file) -> None:
    weights = load_file(weights_file)
    copy = weights[CHANGED_COPY]
    weights[CHANGED_COPY] = copy + 0.05 * torch.randn(
        copy.shape, generator=torch.Generator().manual_seed(9)
    )
    save_file(weights, weights_file)


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    made = Family(request.param, tmp_path_factory.mktemp(request.param))
    yield made
    made.engine.close()


@pytest.fixture(scope="module", autouse=True)
def report_errors():
    yield
    print("\nlargest |engine - PEFT| logit error per family/adapter:")
    for key, error in sorted(MAX_ERRORS.items()):
        print(f"  {key:28s} {error:.2e}")


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_variant_alone_matches_peft(family, variant):
    family.run_against_peft([variant], [11], steps=4)


def test_all_variants_in_one_batch_with_plain_lora_and_base(family):
    names: list[str | None] = [*VARIANTS, "plain", None, None]
    lengths = [5 + 4 * i for i in range(len(names))]  # mixed lengths, several blocks each
    family.run_against_peft(names, lengths, steps=5)


def test_each_variant_changes_the_output(family):
    """Guards the tests above: every adapter moves some logit visibly off the base's."""
    ids = list(range(3, 20))
    base = family.next_logits(None, ids)
    for name in ["plain", *VARIANTS]:
        assert (family.next_logits(name, ids) - base).abs().max() > 1e-2, name


def test_greedy_generation_with_a_saved_head_and_dora_matches_peft(family):
    """Through the engine's own sampling loop, not the stepping harness."""
    for name in ("heads_dora", "saved_lm_head"):
        prompt = list(range(40, 52))
        [out] = family.engine.generate(
            [prompt],
            SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
            lora_request=family.requests[name],
        )
        expected = family.peft[name].generate(
            input_ids=torch.tensor([prompt]),
            max_new_tokens=8,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )[0, len(prompt) :]
        assert out.token_ids == expected.tolist() and out.error is None, name


def test_extras_cost_memory_only_for_adapters_that_have_them(family):
    slots = family.engine.model_runner.lora_slots
    listed = {a["name"]: a for a in family.engine.list_loras()}
    manager = family.engine.lora_manager
    hosts = {name: manager.adapters[listed[name]["adapter_id"]].host for name in listed}
    assert hosts["plain"].extras is None and hosts["patterns"].extras is None
    row = slots.row_nbytes
    assert hosts["plain"].nbytes == hosts["patterns"].nbytes == row
    with_extras = [n for n in VARIANTS if n != "patterns"]
    for name in with_extras:
        assert hosts[name].extras is not None and hosts[name].nbytes > row, name
    # the arena holds exactly the extras of the adapters in slots
    family.run_against_peft([*VARIANTS, "plain"], [3] * (len(VARIANTS) + 1), steps=1)
    itemsize = slots.dtype.itemsize
    assert slots.arena.used == sum(h.extras_numel for h in hosts.values())
    assert manager.stats()["extras_bytes_used"] == slots.arena.used * itemsize
    mc = family.engine.config.model_config
    vocab, hidden = mc.vocab_size, mc.hidden_size
    assert hosts["saved_lm_head"].extras.numel == vocab * hidden  # only its head copy
    assert hosts["embed_tokens"].extras.numel == (vocab + hidden) * 4  # A^T and B at rank 4
    assert hosts["saved_tied"].extras.numel == vocab * hidden  # stored once for both heads


@pytest.mark.parametrize("variant", ["lm_head", "heads_dora", "saved_lm_head", "saved_embed"])
def test_prompt_logprobs_of_head_variants_equal_peft(family, variant):
    """Prompt logprobs compute lm_head on every prompt row, not only the sampled ones; the
    rows of a base request in the same step keep the base head."""
    prompt = [3 + (i * 37) % 380 for i in range(30)]
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    requests = {"adapter": family.requests[variant], "base": None}
    for rid, lora in requests.items():
        family.engine.add_request(
            EngineRequest(rid, prompt_token_ids=prompt, sampling_params=params, lora_request=lora)
        )
    entries = {}
    while family.engine.has_unfinished():
        for out in family.engine.step():
            if out.prompt_logprobs is not None:
                entries[out.request_id] = out.prompt_logprobs
        family.engine.wait_for_load(0.01)
    for rid, name in (("adapter", variant), ("base", None)):
        with torch.no_grad():
            logits = family.peft[name](torch.tensor([prompt])).logits[0]
        expected = logits.log_softmax(-1)[:-1].gather(1, torch.tensor(prompt[1:])[:, None])[:, 0]
        got = torch.tensor([e.logprob for e in entries[rid][1:]])
        torch.testing.assert_close(got, expected, atol=ATOL, rtol=0, msg=f"{rid} {name}")
