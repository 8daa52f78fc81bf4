"""bench/quantized_bases.py measures what it says, on the demo base (its quantizing step needs
the quantizing venv and minutes, so it is left to the run): eval rows are tokenized exactly as
the quality gate's scoring endpoint tokenizes them, and the timed step loop makes the tokens
greedy `generate` makes."""

import json
import sys
from pathlib import Path

import pytest

from inference.engine import LLMEngine, SamplingParams
from inference.operator.scoring import parse_score_body, tokenize_rows
from tests.smollm2 import smollm2_dir

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import quantized_bases  # noqa: E402
from common import chat_prompts  # noqa: E402


@pytest.fixture(scope="module")
def engine():
    engine = LLMEngine(model=str(smollm2_dir()), device="cpu", dtype="float32",
                       kv_cache_bytes=1 << 24)  # fmt: skip
    yield engine
    engine.close()


def test_eval_rows_are_tokenized_as_the_scoring_endpoint_does(engine):
    sets = quantized_bases.eval_rows(engine.tokenizer, set(engine.tokenizer.eos_token_ids))
    assert sorted(sets) == ["french", "json", "pirate"]
    for name, rows in sets.items():
        path = quantized_bases.EVAL_SETS / f"{name}.jsonl"
        raw = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        body = parse_score_body({"adapter_version": None, "rows": raw}, limit=len(raw))
        expected = [(r.prompt_ids, r.completion_ids) for r in tokenize_rows(engine, body.rows)]
        assert rows == expected


def test_the_timed_decode_makes_the_tokens_greedy_generate_makes(engine):
    prompts = chat_prompts(engine.tokenizer, 2)
    tok_s, outputs = quantized_bases.decode_tok_s(engine, prompts, 4)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    assert outputs == [out.token_ids for out in engine.generate(prompts, params)]
    assert tok_s > 0
