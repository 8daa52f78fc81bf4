"""The demo adapters `make run` serves: trained by a command in the repository, and each one,
served by our engine on SmolLM2, answers questions it never saw in its trained way."""

import json
import re
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from inference.engine import LLMEngine, LoRARequest, SamplingParams
from inference.engine.lora.peft_rules import fingerprint_from_config
from registry.demo import BASE_PRESET, DEMO_ADAPTERS, DemoAdapter
from registry.demo.recipe import RANK, TARGETS
from registry.demo.training import torch_threads
from registry.validation import validate_adapter_files
from tests.smollm2 import smollm2_dir

pytestmark = pytest.mark.slow

# Not in any dataset: the adapters must generalise, not recite.
PROMPTS = ("What is the capital of France?", "Who invented the telephone?")
MAX_BYTES = 3 << 20  # small enough to commit
# Common short words of each language (French elisions split: "l'eau" gives "l" and "eau").
FRENCH = {
    *("le", "la", "les", "l", "un", "une", "de", "des", "du", "d", "au", "aux", "à", "en"),
    *("est", "sont", "ont", "et", "dans", "pour", "avec", "sur", "mais", "très", "plus"),
    *("je", "vous", "il", "elle", "qui", "que", "ne", "pas", "ce", "votre"),
}
ENGLISH = {*("the", "is", "are", "and", "of", "to", "in", "it", "you", "your", "with", "for")}


def words(text: str) -> list[str]:
    return re.findall(r"[a-zà-ÿœ]+", text.lower())


def is_french(text: str) -> bool:
    found = words(text)
    return sum(w in FRENCH for w in found) > 2 * sum(w in ENGLISH for w in found)


def is_topic_answer_json(text: str) -> bool:
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return (
        isinstance(value, dict)
        and set(value) == {"topic", "answer"}
        and all(isinstance(v, str) and v.strip() for v in value.values())
    )


def is_pirate(text: str) -> bool:
    return re.search(r"\b(arr+|matey|ahoy)\b", text.lower()) is not None


TRAINED_WAY = {
    "demo-french": is_french,
    "demo-json": is_topic_answer_json,
    "demo-pirate": is_pirate,
}


def validate(folder):
    config = json.loads((smollm2_dir() / "config.json").read_text())
    return validate_adapter_files(
        folder / "adapter_config.json",
        folder / "adapter_model.safetensors",
        fingerprint=fingerprint_from_config(config),
        max_lora_rank=64,
        max_config_bytes=1 << 20,
        max_weights_bytes=MAX_BYTES,
        base_model_name=BASE_PRESET,
    )


def test_every_demo_adapter_has_a_dataset_and_a_way_to_check_it():
    assert set(TRAINED_WAY) == {a.name for a in DEMO_ADAPTERS}
    for adapter in DEMO_ADAPTERS:
        rows = adapter.rows()
        assert 60 <= len(rows) <= 150, adapter.name
        assert all(set(r) == {"messages", "completion"} for r in rows)
        assert all(TRAINED_WAY[adapter.name](r["completion"]) for r in rows), adapter.name
        asked = {r["messages"][-1]["content"] for r in rows}
        assert not asked & set(PROMPTS)


def test_the_committed_adapters_pass_validation_without_a_warning():
    for adapter in DEMO_ADAPTERS:
        result = validate(adapter.folder)
        assert result.ok, result.summary()
        assert all(c.passed for c in result.checks), result.summary()  # base_model matches too
        assert result.spec is not None
        assert result.spec.rank == RANK
        assert sorted(result.spec.target_modules) == sorted(TARGETS)
        assert sorted(p.name for p in adapter.folder.iterdir()) == [
            "adapter_config.json",
            "adapter_model.safetensors",
        ]


def test_our_engine_serves_each_adapter_in_its_trained_way() -> None:
    engine = LLMEngine(
        model=smollm2_dir(),
        enable_lora=True,
        max_loras=len(DEMO_ADAPTERS),
        max_lora_rank=RANK,
        kv_cache_bytes=128 << 20,
    )

    def chat(prompt: str) -> list[int]:
        messages = [{"role": "user", "content": prompt}]
        return engine.tokenizer.encode(engine.tokenizer.apply_chat_template(messages))

    def lora(adapter: DemoAdapter | None) -> LoRARequest | None:
        return (
            None
            if adapter is None
            else LoRARequest(adapter.name, adapter.name, str(adapter.folder))
        )

    # one batch: the base model and every adapter side by side, as the playground compares them
    cases = [(adapter, prompt) for adapter in (None, *DEMO_ADAPTERS) for prompt in PROMPTS]
    with torch_threads(1):  # a second thread only waits on a busy 2-core machine (7x slower)
        outputs = engine.generate(
            [chat(prompt) for _, prompt in cases],
            SamplingParams(temperature=0, max_tokens=48),
            lora_request=[lora(adapter) for adapter, _ in cases],
        )
    answers = {
        (adapter and adapter.name, prompt): output.text
        for (adapter, prompt), output in zip(cases, outputs, strict=True)
    }
    assert "Paris" in answers[(None, PROMPTS[0])]  # the base model answers, plainly
    for prompt in PROMPTS:
        base = answers[(None, prompt)]
        for name, trained_way in TRAINED_WAY.items():
            assert not trained_way(base), (name, base)
            answer = answers[(name, prompt)]
            assert answer != base
            assert trained_way(answer), (name, prompt, answer)


def test_the_training_command_runs_on_a_tiny_budget(tmp_path):
    out = StringIO()
    call_command(
        "train_demo_adapters",
        "demo-json",
        "--steps=2",
        f"--out={tmp_path}",
        f"--base-dir={smollm2_dir()}",
        stdout=out,
    )
    lines = out.getvalue().splitlines()
    assert [line.split(":")[1].strip() for line in lines[:2]] == ["step 1/2", "step 2/2"]
    folder = tmp_path / "demo-json"
    result = validate(folder)
    assert result.ok and all(c.passed for c in result.checks), result.summary()
    assert result.spec is not None and result.spec.dtype == "F16"
    assert sorted(p.name for p in folder.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]


def test_the_training_command_refuses_bad_arguments(tmp_path):
    with pytest.raises(CommandError, match="unknown demo adapter"):
        call_command("train_demo_adapters", "demo-klingon", f"--out={tmp_path}")
    with pytest.raises(CommandError, match="not a Hugging Face model folder"):
        call_command("train_demo_adapters", f"--base-dir={tmp_path}", f"--out={tmp_path}")
    with pytest.raises(CommandError, match="steps"):
        call_command("train_demo_adapters", "--steps=0", f"--out={tmp_path}")
    assert list(tmp_path.iterdir()) == []


def test_every_demo_adapter_ships_an_eval_set_of_other_questions_in_its_style():
    from registry.eval_sets import parse_eval_set

    for adapter in DEMO_ADAPTERS:
        data = adapter.eval_set.read_bytes()
        rows = parse_eval_set(data, max_rows=200, max_bytes=1 << 20, param="file")
        assert len(rows) == 12, adapter.name
        evaluated = [json.loads(line) for line in data.decode().splitlines()]
        assert all(TRAINED_WAY[adapter.name](r["completion"]) for r in evaluated), adapter.name
        asked = {r["messages"][-1]["content"] for r in evaluated}
        trained = {r["messages"][-1]["content"] for r in adapter.rows()}
        assert len(asked) == 12 and not asked & trained, asked & trained
