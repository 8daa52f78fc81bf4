"""Structured outputs in the engine: every sampled output matches its JSON schema, on the
base model and an adapter, mixed with unconstrained requests that stay exactly as they were.

A random-weight tiny Llama with a real byte-level BPE tokenizer (tests/tiny_llama.py): the
grammar sees the same kind of vocabulary as a real model's. The schemas bound every string,
number and array, so a random model at temperature 1 closes its JSON in a few dozen tokens.
"""

import asyncio
import json
import sys
import threading

import jsonschema  # type: ignore[import-untyped]
import pytest
import torch

from inference.engine import (
    AsyncLLMEngine,
    EngineRequest,
    LLMEngine,
    SamplingParams,
    SamplingParamsError,
    StructuredOutput,
    StructuredOutputUnavailableError,
    UnsupportedSchemaError,
)
from inference.engine.sampler import Sampler
from inference.engine.sequence import Sequence
from tests.engine.lora_fixtures import lora_engine, request_for, run_all
from tests.engine.structured_output_schemas import CASES, ENUMS, NESTED, UNSUPPORTED
from tests.tiny_llama import make_tiny_llama

PROMPTS = ["The quick brown fox", "Paris is the capital", "Numbers 0 1 2 3"]
SEEDS = range(10)


def sampled(spec, seed: int, **kwargs) -> SamplingParams:
    """Temperature 1; odd seeds also cut with top-k and top-p."""
    kwargs.setdefault("max_tokens", 160)
    if seed % 2:
        kwargs |= {"top_k": 50, "top_p": 0.9}
    return SamplingParams(temperature=1.0, seed=seed, structured_output=spec, **kwargs)


def schema_of(spec: StructuredOutput) -> dict:
    return spec.schema()


@pytest.fixture(scope="module")
def engine(lora_model_dir):
    """The base model alone: most tests need no adapter, and skip the LoRA work."""
    engine = LLMEngine(model=lora_model_dir, kv_cache_bytes=8 << 20)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def adapter(adapters):
    return request_for("json-tuned", adapters("json-tuned"))


@pytest.fixture(scope="module")
def lora(lora_model_dir):
    engine = lora_engine(lora_model_dir, kv_cache_bytes=8 << 20)
    yield engine
    engine.close()


@pytest.fixture(params=["base", "adapter"])
def served(request, engine, lora, adapter):
    """(engine, LoRA request) of the base model, then of a random-weight adapter."""
    return (engine, None) if request.param == "base" else (lora, adapter)


def test_every_sampled_output_matches_its_schema(served):
    """10 seeds and greedy per schema, all in one batch with unconstrained requests, whose
    tokens stay those they get alone."""
    engine, adapter = served
    plain = [
        SamplingParams(temperature=1.0, seed=7, max_tokens=24, ignore_eos=True, logprobs=3),
        SamplingParams(temperature=0.8, top_k=40, top_p=0.9, seed=8, max_tokens=24),
        SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=2),
    ]
    alone = engine.generate(PROMPTS, plain, adapter)
    specs = {name: StructuredOutput.from_schema(case[0]) for name, case in CASES.items()}
    jobs = [(name, seed) for name in specs for seed in [*SEEDS, None]]
    greedy = {
        name: SamplingParams(temperature=0, max_tokens=160, structured_output=spec)
        for name, spec in specs.items()
    }
    outs = engine.generate(
        [*PROMPTS, *(PROMPTS[(seed or 0) % len(PROMPTS)] for _, seed in jobs)],
        [*plain, *(greedy[n] if s is None else sampled(specs[n], s) for n, s in jobs)],
        adapter,
    )
    for before, after in zip(alone, outs, strict=False):
        assert after.token_ids == before.token_ids
        assert after.finish_reason == before.finish_reason
        for a, b in zip(after.logprobs, before.logprobs, strict=True):
            assert a.logprob == pytest.approx(b.logprob, abs=1e-5)
    texts: dict[str, set[str]] = {}
    for (name, seed), out in zip(jobs, outs[len(plain) :], strict=True):
        assert out.finish_reason == "stop", f"{name}, seed {seed}: {out.text!r}"
        jsonschema.validate(json.loads(out.text), CASES[name][0])
        texts.setdefault(name, set()).add(out.text)
    assert all(len(t) > 1 for t in texts.values()), "seeds should give different outputs"
    bm = engine.block_manager  # every block free again, but the adapter's slot's pages
    assert bm.num_free_blocks + bm.num_lent_pages == bm.num_blocks


def test_any_json_object(served):
    """A random model rarely closes a string it opened (a key here), so a JSON object of
    its own choosing may run to max_tokens; every one that stops is a JSON object."""
    engine, adapter = served
    spec = StructuredOutput.any_json_object()
    outs = engine.generate(
        [PROMPTS[seed % len(PROMPTS)] for seed in SEEDS],
        [sampled(spec, seed, max_tokens=24) for seed in SEEDS],
        adapter,
    )
    stopped = [out for out in outs if out.finish_reason == "stop"]
    assert stopped, "some outputs should close their object"
    for out in stopped:
        assert isinstance(json.loads(out.text), dict)
    for out in outs:
        assert out.finish_reason in ("stop", "length") and out.text.startswith("{")


def test_the_json_object_grammar_takes_any_object_and_nothing_else(engine):
    compiled = engine.structured.compile(StructuredOutput.any_json_object())
    tokens = engine.tokenizer.encode
    whole = {"a": [1, 2.5, None, True], "b": {"c": "Héllo 🙂"}, "d": -3e-2}
    matcher = compiled.matcher()
    text = json.dumps(whole, ensure_ascii=False)  # characters as they are, not \\u escapes
    assert all(matcher.accept(t) for t in tokens(text, add_special_tokens=False))
    assert matcher.is_complete
    for not_an_object in ([1], "text", 3):
        matcher = compiled.matcher()
        assert not matcher.accept(tokens(json.dumps(not_an_object), add_special_tokens=False)[0])


def test_the_grammar_ends_on_the_engines_eos_tokens(engine):
    """A bare integer may end after any digit: there, and only there, the grammar allows
    the engine's end-of-sequence tokens, and no other special token."""
    spec = StructuredOutput.from_schema({"type": "integer", "minimum": 0, "maximum": 999})
    vocab = engine.config.model_config.vocab_size

    def allowed(matcher) -> set[int]:
        bitmask = matcher.backend.fill_bitmask([matcher.matcher])[0]
        return {t for t in range(vocab) if (int(bitmask[t // 32]) >> (t % 32)) & 1}

    matcher = engine.structured.compile(spec).matcher()
    assert not engine.eos_token_ids & allowed(matcher)  # nothing written yet
    assert matcher.accept(engine.tokenizer.encode("7", add_special_tokens=False)[0])
    special = {engine.tokenizer.encode(t)[0] for t in ("<|endoftext|>", "<|im_start|>")}
    assert engine.eos_token_ids <= allowed(matcher) and not special & allowed(matcher)
    for ignore_eos in (False, True):  # either way the request ends once the JSON is whole
        params = [sampled(spec, seed, ignore_eos=ignore_eos) for seed in SEEDS]
        for out in engine.generate([PROMPTS[0]] * len(params), params):
            assert out.finish_reason == "stop" and 0 <= int(out.text) <= 999
            # it ended on an eos token, or where no digit may follow ("0", or three digits)
            assert (
                out.token_ids[-1] in engine.eos_token_ids or out.text == "0" or len(out.text) == 3
            )


def test_the_sampler_leaves_unconstrained_rows_bit_for_bit_alone(engine):
    """Same logits and generators, a constrained neighbour or a plain one: the plain rows
    get the same tokens and logprobs, and the constrained row only what its grammar allows."""
    spec = StructuredOutput.from_schema(ENUMS)
    compiled = engine.structured.compile(spec)
    torch.manual_seed(0)
    logits = torch.randn(4, engine.config.model_config.vocab_size) * 4
    kinds = [
        SamplingParams(temperature=1.0, top_k=50, logprobs=3),
        SamplingParams(temperature=0, logprobs=3),
    ]

    def run(constrained: bool):
        seqs = []
        for i in range(4):
            params = kinds[i % 2]
            seq = Sequence(
                str(i),
                [0],
                params,
                seed=i,
                detokenizer=engine.tokenizer.detokenizer(),
            )
            if constrained and i >= 2:
                seq.grammar = compiled.matcher()
            seqs.append(seq)
        return Sampler()(logits.clone(), seqs)

    plain, mixed = run(False), run(True)
    assert mixed.token_ids[:2] == plain.token_ids[:2]
    assert mixed.logprobs[:2] == plain.logprobs[:2]
    for a, b in zip(mixed.logprobs[2:], plain.logprobs[2:], strict=True):
        assert a is not None and b is not None
        assert a.top == b.top  # the raw logits' logprobs, even on a constrained row
    brace = engine.tokenizer.encode("{", add_special_tokens=False)
    assert [mixed.token_ids[2]] == brace and [mixed.token_ids[3]] == brace
    assert plain.token_ids[2:] != mixed.token_ids[2:]


def test_logprobs_are_those_of_the_raw_logits(engine):
    free = engine.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=1, logprobs=5))
    spec = StructuredOutput.from_schema(ENUMS)
    constrained = SamplingParams(temperature=0, max_tokens=1, logprobs=5, structured_output=spec)
    [out] = engine.generate(PROMPTS[:1], constrained)
    assert engine.tokenizer.decode(out.token_ids) == "{"  # the only token the grammar allows
    assert out.logprobs[0].top == free[0].logprobs[0].top  # what the model wanted, unmasked


def test_max_tokens_cuts_the_json_with_length(engine):
    spec = StructuredOutput.from_schema(NESTED)
    [out] = engine.generate(PROMPTS[:1], sampled(spec, 0, max_tokens=4))
    assert out.finish_reason == "length" and len(out.token_ids) == 4
    assert out.text.startswith('{"')
    with pytest.raises(json.JSONDecodeError):
        json.loads(out.text)


def test_preemption_mid_json_keeps_the_same_valid_output(lora_model_dir):
    specs = [StructuredOutput.from_schema(case[0]) for case in CASES.values()]
    params = [sampled(spec, seed) for seed, spec in enumerate(specs)]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(specs))]
    roomy = LLMEngine(model=lora_model_dir, block_size=4, kv_cache_bytes=4 << 20)
    expected = roomy.generate(prompts, params)
    block_bytes = roomy.config.kv_block_bytes
    # 24 blocks of 4 tokens: a few sequences at a time, so decodes must preempt
    tight = LLMEngine(model=lora_model_dir, block_size=4, kv_cache_bytes=24 * block_bytes)
    outs = tight.generate(prompts, params)
    assert tight.scheduler.num_preemptions > 0
    for out, want, spec in zip(outs, expected, specs, strict=True):
        assert out.token_ids == want.token_ids
        jsonschema.validate(json.loads(out.text), schema_of(spec))


def test_unsupported_features_are_named(engine):
    for keyword, schema in UNSUPPORTED.items():
        spec = StructuredOutput.from_schema(schema)
        with pytest.raises(UnsupportedSchemaError, match="unsupported feature") as info:
            engine.structured.compile(spec)
        for name in keyword.split("/"):
            assert repr(name) in str(info.value)
    spec = StructuredOutput.from_schema({"type": "string", "format": "no-such-format"})
    with pytest.raises(UnsupportedSchemaError, match="unsupported string format: 'no-such"):
        engine.structured.compile(spec)


@pytest.mark.parametrize(
    ("make", "error", "words"),
    [
        (
            lambda: StructuredOutput.from_schema([1]),  # type: ignore[arg-type]
            UnsupportedSchemaError,
            "must be a JSON object",
        ),
        (
            lambda: StructuredOutput.from_schema({"enum": {1, 2}}),
            UnsupportedSchemaError,
            "is not JSON",
        ),
        (
            lambda: StructuredOutput.from_schema({"maximum": float("nan")}),
            UnsupportedSchemaError,
            "is not JSON",
        ),
        (lambda: StructuredOutput(json_schema="{oops"), UnsupportedSchemaError, "not valid JSON"),
        (lambda: StructuredOutput(json_schema="[]"), UnsupportedSchemaError, "a JSON object"),
        (lambda: StructuredOutput(), SamplingParamsError, "exactly one"),
        (
            lambda: StructuredOutput(json_schema="{}", json_object=True),
            SamplingParamsError,
            "exactly one",
        ),
        (
            lambda: SamplingParams(structured_output={"type": "object"}),  # type: ignore[arg-type]
            SamplingParamsError,
            "must be a StructuredOutput",
        ),
    ],
)
def test_malformed_structured_outputs_are_clear_errors(make, error, words):
    with pytest.raises(error, match=words):
        make()


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"type": "string", "pattern": "(("}, "regex parse error"),
        ({"type": "strin"}, "Invalid type: strin"),
        ({"$ref": "#/$defs/missing"}, "missing"),
    ],
)
def test_invalid_schemas_are_clear_errors(engine, schema, words):
    with pytest.raises(UnsupportedSchemaError, match=words):
        engine.structured.compile(StructuredOutput.from_schema(schema))


def test_a_schema_failing_in_the_background_ends_only_its_request(engine):
    bad = StructuredOutput.from_schema({"type": "object", "uniqueItems": True, "not": {}})
    good = StructuredOutput.from_schema({**ENUMS, "title": "fresh, not cached yet"})
    engine.add_request(EngineRequest("bad", PROMPTS[0], sampled(bad, 0)))
    engine.add_request(EngineRequest("good", PROMPTS[1], sampled(good, 1)))
    engine.add_request(EngineRequest("plain", PROMPTS[2], SamplingParams(max_tokens=5)))
    results = run_all(engine)
    assert results["bad"]["finish"] == "abort" and results["bad"]["tokens"] == []
    assert isinstance(results["bad"]["error"], UnsupportedSchemaError)
    assert "'not', 'uniqueItems'" in str(results["bad"]["error"])
    assert results["good"]["finish"] == "stop" and results["good"]["error"] is None
    text = engine.tokenizer.decode(results["good"]["tokens"])
    jsonschema.validate(json.loads(text), ENUMS)
    assert results["plain"]["error"] is None and results["plain"]["finish"] in ("stop", "length")


def test_a_cached_grammar_is_attached_at_once_and_compiled_once(engine):
    spec = StructuredOutput.from_schema({**ENUMS, "title": "cache check"})
    seq = engine.make_sequence(EngineRequest("a", PROMPTS[0], sampled(spec, 0)))
    assert seq.awaiting_grammar and seq.grammar is None
    compiled = seq.grammar_future.result(timeout=30)
    assert engine.structured.compile(spec) is compiled  # the background compile was cached
    again = engine.make_sequence(EngineRequest("b", PROMPTS[0], sampled(spec, 1)))
    assert not again.awaiting_grammar and again.grammar is not None
    # many threads asking at once for a schema not yet compiled: one compile, one grammar
    fresh = StructuredOutput.from_schema({**ENUMS, "title": "raced"})
    got = []
    threads = [
        threading.Thread(target=lambda: got.append(engine.structured.compile(fresh)))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 4 and all(g is got[0] for g in got)


def test_padded_model_vocabulary_never_samples_padding(tmp_path):
    folder = make_tiny_llama(tmp_path, vocab=400)  # the tokenizer has 384 tokens
    engine = LLMEngine(model=folder, kv_cache_bytes=4 << 20)
    spec = StructuredOutput.from_schema(NESTED)
    outs = engine.generate(PROMPTS, [sampled(spec, seed) for seed in range(3)])
    for out in outs:
        assert out.finish_reason == "stop"
        assert max(out.token_ids) < engine.tokenizer.vocab_size
        jsonschema.validate(json.loads(out.text), NESTED)


def test_without_llguidance_only_constrained_requests_are_refused(lora_model_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "llguidance", None)  # `import llguidance` now fails
    engine = LLMEngine(model=lora_model_dir, kv_cache_bytes=1 << 20)
    spec = StructuredOutput.from_schema(ENUMS)
    with pytest.raises(StructuredOutputUnavailableError, match="llguidance"):
        engine.add_request(EngineRequest("json", PROMPTS[0], sampled(spec, 0)))
    with pytest.raises(StructuredOutputUnavailableError, match="llguidance"):
        engine.structured.compile(spec)
    assert not engine.requests
    [out] = engine.generate(PROMPTS[:1], SamplingParams(max_tokens=4, ignore_eos=True))
    assert out.finish_reason == "length" and len(out.token_ids) == 4


def test_async_engine_compiles_off_the_loop_and_streams_valid_json(lora_model_dir):
    engine = AsyncLLMEngine.from_config(model=lora_model_dir, kv_cache_bytes=1 << 20)
    spec = StructuredOutput.from_schema({**NESTED, "title": "async"})

    async def main() -> str:
        bad = StructuredOutput.from_schema({"type": "string", "pattern": "(("})
        with pytest.raises(UnsupportedSchemaError, match="regex"):
            await engine.compile_structured_output(bad)
        stream = engine.generate(EngineRequest("r", PROMPTS[0], sampled(spec, 3)))
        outs = [out async for out in stream]  # compiled in the background meanwhile
        assert outs[-1].finish_reason == "stop"
        await engine.compile_structured_output(spec)  # cached by now
        return "".join(out.new_text for out in outs)

    try:
        text = asyncio.run(main())
    finally:
        engine.shutdown()
    jsonschema.validate(json.loads(text), NESTED)


def test_a_panic_of_the_grammar_engine_is_a_one_line_schema_error(engine, monkeypatch):
    """pyo3 raises a Rust panic as PanicException, a BaseException: before, it escaped every
    `except Exception` and its text (a backtrace, build paths) reached the caller."""

    class PanicException(BaseException):
        pass

    backend = engine.structured._get_backend()

    def panic(*args, **kwargs):
        raise PanicException(
            "called `Option::unwrap()` on a `None` value\n"
            "  at /root/.cargo/registry/src/index/llguidance-1.9.1/src/json/compiler.rs:412:9\n"
            "stack backtrace:\n   0: rust_begin_unwind\n" + "   1: frame\n" * 10_000
        )

    monkeypatch.setattr(backend.llg.LLMatcher, "grammar_from_json_schema", panic)
    spec = StructuredOutput.from_schema({"type": "object", "properties": {"never": {}}})
    with pytest.raises(UnsupportedSchemaError) as info:
        engine.structured.compile(spec)
    message = str(info.value)
    assert "too large or too complex" in message
    assert ".rs" not in message and "backtrace" not in message and len(message) < 200


def test_a_long_grammar_engine_message_is_cut_to_its_first_line(engine, monkeypatch):
    backend = engine.structured._get_backend()

    def refuse(*args, **kwargs):
        raise ValueError("bad rule at /build/src/grammar.rs:12:3: " + "x" * 100_000 + "\nmore")

    monkeypatch.setattr(backend.llg.LLMatcher, "grammar_from_json_schema", refuse)
    spec = StructuredOutput.from_schema({"type": "object", "properties": {"cut": {}}})
    with pytest.raises(UnsupportedSchemaError) as info:
        engine.structured.compile(spec)
    message = str(info.value)
    assert "<source>" in message and "/build/" not in message and "more" not in message
    assert len(message) < 300


def test_a_schema_that_admits_nothing_is_refused(engine):
    """`{"$ref": "#"}` compiles to a grammar that is finished before its first token:
    before, the request answered 200 with empty content."""
    with pytest.raises(UnsupportedSchemaError, match="admits no JSON value"):
        engine.structured.compile(StructuredOutput.from_schema({"$ref": "#"}))
