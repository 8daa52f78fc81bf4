"""The trained adapter, its eval set and the noisy base revisions that issue 13's tests use."""

from __future__ import annotations

import json

import pytest

from inference.engine import LLMEngine, LoRARequest
from registry.services.base_models import model_revision
from tests.tiny_llama import make_tiny_llama
from tests.trained_adapter import (
    ANSWER,
    DEGRADING_NOISE,
    HARMLESS_NOISE,
    QUALITY_FACTOR,
    RowEncoder,
    eval_set_jsonl,
    noisy_copy,
    reference_nll,
    task_rows,
    train_adapter,
)


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("trained-base"))


@pytest.fixture(scope="module", params=[False, True], ids=["prompt", "chat"])
def trained(request, base_dir, tmp_path_factory):
    """(rows, adapter folder, its eval figures on the original base) per row shape."""
    rows = task_rows(chat=request.param)
    adapter = train_adapter(base_dir, tmp_path_factory.mktemp("trained"), rows=rows.train)
    return rows, adapter, reference_nll(base_dir, adapter, rows.eval)


def test_rows_split_and_jsonl():
    rows = task_rows(8, seed=3, eval_n=4)
    assert (len(rows.train), len(rows.eval)) == (8, 4)
    assert not {r["prompt"] for r in rows.train} & {r["prompt"] for r in rows.eval}
    assert task_rows(8, seed=3, eval_n=4) == rows  # seeded
    lines = eval_set_jsonl(rows.eval).decode().splitlines()
    assert [json.loads(line) for line in lines] == rows.eval
    assert all(set(r) == {"prompt", "completion"} and r["completion"] == ANSWER for r in rows.eval)
    chat = task_rows(4, chat=True).eval
    assert all(set(r) == {"messages", "completion"} for r in chat)


def test_the_adapter_learns_the_task(base_dir, trained):
    rows, adapter, figures = trained
    assert {p.name for p in adapter.iterdir()} >= {
        "adapter_config.json",
        "adapter_model.safetensors",
    }
    base = reference_nll(base_dir, None, rows.eval)
    assert figures["tokens"] == base["tokens"] == sum(r["tokens"] for r in figures["rows"])
    assert figures["perplexity"] <= base["perplexity"] / 2, (figures, base)
    assert all(a["nll"] < b["nll"] for a, b in zip(figures["rows"], base["rows"], strict=True))


def test_training_is_deterministic(base_dir, tmp_path):
    rows = task_rows(8, eval_n=2).train
    one = train_adapter(base_dir, tmp_path / "one", rows=rows, steps=3)
    two = train_adapter(base_dir, tmp_path / "two", rows=rows, steps=3)
    name = "adapter_model.safetensors"
    assert (one / name).read_bytes() == (two / name).read_bytes()


def test_reference_matches_the_engine(base_dir, trained):
    """reference_nll counts the tokens and figures the platform's scorer does (prompt as
    /v1/completions or /v1/chat/completions encodes it, chat completions ending their turn)."""
    from inference.operator.scoring import Row, tokenize_rows

    rows, adapter, figures = trained
    engine = LLMEngine(model=base_dir, enable_lora=True, kv_cache_bytes=4 << 20, block_size=4)
    tokenized = tokenize_rows(engine, [Row(**row) for row in rows.eval])
    encode = RowEncoder(base_dir)
    assert [(t.prompt_ids, t.completion_ids) for t in tokenized] == [encode(r) for r in rows.eval]
    lora = LoRARequest("trained", "id-trained", str(adapter))
    for row, ref in zip(tokenized, figures["rows"], strict=True):
        score = engine.score(row.prompt_ids, row.completion_ids, lora)
        assert score.num_tokens == ref["tokens"]
        assert -score.logprob == pytest.approx(ref["nll"], abs=1e-3)


def test_noisy_copies_are_new_revisions_of_the_same_model(base_dir, tmp_path):
    copy = noisy_copy(base_dir, tmp_path / "noisy", scale=HARMLESS_NOISE)
    assert sorted(p.name for p in copy.iterdir()) == sorted(p.name for p in base_dir.iterdir())
    assert (copy / "config.json").read_bytes() == (base_dir / "config.json").read_bytes()
    assert model_revision(copy) != model_revision(base_dir)
    again = noisy_copy(base_dir, tmp_path / "again", scale=HARMLESS_NOISE)
    assert model_revision(again) == model_revision(copy)  # seeded


@pytest.mark.parametrize(
    "scale, degrades",
    [(DEGRADING_NOISE, True), (HARMLESS_NOISE, False)],
    ids=["degrading", "harmless"],
)
def test_noise_against_the_quality_factor(base_dir, trained, tmp_path, scale, degrades):
    rows, adapter, figures = trained
    noisy = noisy_copy(base_dir, tmp_path / "noisy", scale=scale)
    ratio = reference_nll(noisy, adapter, rows.eval)["perplexity"] / figures["perplexity"]
    if degrades:
        assert ratio > 1.5 * QUALITY_FACTOR, ratio
    else:
        assert abs(ratio - 1) < (QUALITY_FACTOR - 1) / 10, ratio
