"""Grammar engines for structured outputs: xgrammar against llguidance on our tokenizer.

    .venv/bin/python bench/grammar_engines.py [--model DIR] [--walks 20] [--repeats 20]

Both are set up from the model folder's tokenizer.json alone (no transformers tokenizer:
llguidance reads tokenizer.json, xgrammar gets the vocabulary from the `tokenizers`
library), with the same JSON format: compact separators ", " and ": ", no free whitespace.
For each schema of tests/engine/structured_output_schemas.py and for "any JSON object":

- compile, cold: schema -> a matcher ready for its first token, nothing cached;
  cached: a matcher from the compiled grammar kept from before (what an engine's cache
  gives a second request with the same schema);
- per token, on the valid instance's tokens: filling one row of the token bitmask, and
  accepting the token; then the batched fill of 8 matchers at once (one step of a batch);
- correctness: the valid instance is accepted and completes; the invalid one is refused
  somewhere; --walks random walks (a uniformly random allowed token each step) end
  complete within 300 tokens and validate with jsonschema (any JSON object has unbounded
  strings, so some walks never close it); and for keywords neither enforces, whether
  compiling refuses the schema (a clear error) or ignores the keyword silently.

The last line is one JSON object of the figures.
"""

import importlib
import json
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import torch
from common import bench_parser, model_dir

from inference.engine.grammar_mask import apply_bitmask
from inference.engine.tokenizer import Tokenizer
from tests.engine.structured_output_schemas import CASES, UNSUPPORTED

SEPARATORS = (", ", ": ")
JSON_OBJECT: dict[str, Any] = {"type": "object"}
BATCH = 8
MAX_WALK = 300


class Llguidance:
    name = "llguidance"

    def __init__(self, folder: Path, tokenizer: Tokenizer, vocab: int):
        import llguidance

        self.llg = llguidance
        text = (folder / "tokenizer.json").read_text()
        self.tokenizer = llguidance.LLTokenizer(
            text, n_vocab=vocab, eos_token=tokenizer.eos_token_ids
        )
        self.executor = llguidance.LLExecutor(num_threads=torch.get_num_threads())
        self.options: Any = {
            "whitespace_flexible": False,
            "item_separator": SEPARATORS[0],
            "key_separator": SEPARATORS[1],
        }

    def compile(self, schema: dict[str, Any]) -> Any:
        """The compiled form is a fresh matcher; a cached one is deep-copied."""
        grammar = self.llg.LLMatcher.grammar_from_json_schema(schema, overrides=self.options)
        is_error, messages = self.llg.LLMatcher.validate_grammar_with_warnings(
            grammar, self.tokenizer
        )
        if is_error:
            raise ValueError(messages[0])
        return self.llg.LLMatcher(self.tokenizer, grammar, log_level=0)

    def matcher(self, compiled: Any) -> Any:
        return compiled.deep_copy()

    # as the engine does it (grammar.py); llguidance.torch would pull in torch.compile
    def fill(self, matcher: Any, bitmask: torch.Tensor, row: int) -> None:
        words = bitmask.shape[1]
        matcher.unsafe_compute_mask_ptr(bitmask[row].data_ptr(), words * 4)

    def fill_batch(self, matchers: list[Any], bitmask: torch.Tensor) -> None:
        rows = [(m, i) for i, m in enumerate(matchers)]
        self.executor.unsafe_compute_mask_ptr(
            rows, bitmask.data_ptr(), bitmask.shape[1] * 4, len(rows)
        )

    def accept(self, matcher: Any, token: int) -> bool:
        return bool(matcher.consume_token(token))

    def done(self, matcher: Any) -> bool:
        return bool(matcher.is_stopped())


class Xgrammar:
    name = "xgrammar"

    def __init__(self, folder: Path, tokenizer: Tokenizer, vocab: int):
        import xgrammar

        self.xgr = xgrammar
        backend = tokenizer._backend  # the `tokenizers` object our Tokenizer wraps
        by_id = backend.get_vocab(with_added_tokens=True)
        encoded = [""] * len(by_id)
        for token, i in by_id.items():
            encoded[i] = token
        meta = xgrammar.TokenizerInfo._detect_metadata_from_hf(backend.to_str())
        self.info = xgrammar.TokenizerInfo(
            encoded,
            meta["vocab_type"],
            vocab_size=vocab,
            stop_token_ids=tokenizer.eos_token_ids,
            add_prefix_space=meta["add_prefix_space"],
        )
        self.threads = torch.get_num_threads()
        self.batch = xgrammar.BatchGrammarMatcher(self.threads)

    def compile(self, schema: dict[str, Any]) -> Any:
        compiler = self.xgr.GrammarCompiler(
            self.info, max_threads=self.threads, cache_enabled=False
        )
        # strict_mode=False keeps JSON Schema's meaning (extra properties unless forbidden)
        return compiler.compile_json_schema(
            json.dumps(schema), any_whitespace=False, separators=SEPARATORS, strict_mode=False
        )

    def matcher(self, compiled: Any) -> Any:
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, matcher: Any, bitmask: torch.Tensor, row: int) -> None:
        matcher.fill_next_token_bitmask(bitmask, row)

    def fill_batch(self, matchers: list[Any], bitmask: torch.Tensor) -> None:
        self.batch.batch_fill_next_token_bitmask(matchers, bitmask)

    def accept(self, matcher: Any, token: int) -> bool:
        return bool(matcher.accept_token(token))

    def done(self, matcher: Any) -> bool:
        # after the JSON closes only a stop token may follow
        return bool(matcher.is_terminated() or matcher.is_completed())


Engine = Llguidance | Xgrammar


def allowed(bitmask: torch.Tensor, row: int, vocab: int) -> torch.Tensor:
    """The allowed token ids of one bitmask row."""
    bits = (bitmask[row, :, None] >> torch.arange(32, dtype=torch.int32)) & 1
    return bits.reshape(-1)[:vocab].nonzero()[:, 0]


def timed(fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - start


def compile_cold(engine: Engine, schema: dict[str, Any]) -> Any:
    return engine.matcher(engine.compile(schema))


def feed(engine: Engine, compiled: Any, tokens: list[int], vocab: int) -> dict[str, Any]:
    """Walk a token list through a matcher, checking each token against the mask."""
    matcher = engine.matcher(compiled)
    bitmask = torch.full((1, (vocab + 31) // 32), -1, dtype=torch.int32)
    fills: list[float] = []
    accepts: list[float] = []
    for i, token in enumerate(tokens):
        _, t = timed(engine.fill, matcher, bitmask, 0)
        fills.append(t)
        if not (bitmask[0, token // 32] >> (token % 32)) & 1:
            return {"accepted": i, "complete": False, "fills": fills, "accepts": accepts}
        ok, t = timed(engine.accept, matcher, token)
        accepts.append(t)
        if not ok:
            return {"accepted": i, "complete": False, "fills": fills, "accepts": accepts}
    return {
        "accepted": len(tokens),
        "complete": engine.done(matcher),
        "fills": fills,
        "accepts": accepts,
    }


def walk(
    engine: Engine, compiled: Any, tokenizer: Tokenizer, vocab: int, rng: random.Random
) -> str | None:
    """Random allowed tokens until the grammar is done; its text (None if not done after
    MAX_WALK tokens)."""
    eos = set(tokenizer.eos_token_ids)
    matcher = engine.matcher(compiled)
    bitmask = torch.full((1, (vocab + 31) // 32), -1, dtype=torch.int32)
    tokens: list[int] = []
    while len(tokens) < MAX_WALK and not engine.done(matcher):
        engine.fill(matcher, bitmask, 0)
        choices = [t for t in allowed(bitmask, 0, vocab).tolist() if t not in eos]
        if not choices:
            break
        token = rng.choice(choices)
        assert engine.accept(matcher, token), "a token the mask allowed was refused"
        tokens.append(token)
    return tokenizer.decode(tokens) if engine.done(matcher) else None


def bench_engine(
    engine: Engine, tokenizer: Tokenizer, vocab: int, walks: int, repeats: int
) -> dict[str, Any]:
    result: dict[str, Any] = {"schemas": {}}
    all_fills: list[float] = []
    all_accepts: list[float] = []
    batch_fills: list[float] = []
    schemas = {name: case[0] for name, case in CASES.items()} | {"json_object": JSON_OBJECT}
    for name, schema in schemas.items():
        cold = [timed(compile_cold, engine, schema)[1] for _ in range(5)]
        compiled = engine.compile(schema)
        cached = [timed(engine.matcher, compiled)[1] for _ in range(repeats)]
        entry: dict[str, Any] = {
            "compile_cold_ms": 1000 * statistics.median(cold),
            "compile_cached_ms": 1000 * statistics.median(cached),
        }
        if name in CASES:
            _, good, bad = CASES[name]
            good_tokens = tokenizer.encode(json.dumps(good), add_special_tokens=False)
            bad_tokens = tokenizer.encode(json.dumps(bad), add_special_tokens=False)
            for _ in range(repeats):
                fed = feed(engine, compiled, good_tokens, vocab)
                all_fills += fed["fills"]
                all_accepts += fed["accepts"]
            entry["valid_accepted"] = fed["accepted"] == len(good_tokens) and fed["complete"]
            entry["invalid_refused"] = feed(engine, compiled, bad_tokens, vocab)["accepted"] < len(
                bad_tokens
            )
            # one step of a batch: 8 matchers part way through the valid instance
            matchers = []
            for k in range(BATCH):
                m = engine.matcher(compiled)
                for token in good_tokens[: k * len(good_tokens) // BATCH]:
                    engine.accept(m, token)
                matchers.append(m)
            bitmask = torch.full((BATCH, (vocab + 31) // 32), -1, dtype=torch.int32)
            batch_fills += [timed(engine.fill_batch, matchers, bitmask)[1] for _ in range(repeats)]
        rng = random.Random(0)
        valid = 0
        for _ in range(walks):
            text = walk(engine, compiled, tokenizer, vocab, rng)
            try:
                jsonschema.validate(json.loads(text or ""), schema)
                valid += 1
            except (ValueError, jsonschema.ValidationError):
                pass
        entry["random_walks_valid"] = f"{valid}/{walks}"
        result["schemas"][name] = entry
    result["fill_us_p50"] = 1e6 * statistics.median(all_fills)
    result["accept_us_p50"] = 1e6 * statistics.median(all_accepts)
    result["batch8_fill_us_p50"] = 1e6 * statistics.median(batch_fills)
    result["unsupported"] = {}
    for keyword, schema in UNSUPPORTED.items():
        try:
            engine.compile(schema)
            result["unsupported"][keyword] = "silently ignored"
        except Exception as e:  # noqa: BLE001 - each library raises its own kind
            result["unsupported"][keyword] = f"refused: {str(e).splitlines()[0][:80]}"
    try:
        engine.compile({"type": "string", "pattern": "(("})
        result["bad_regex"] = "silently accepted"
    except Exception as e:  # noqa: BLE001
        result["bad_regex"] = f"refused: {str(e).splitlines()[0][:80]}"
    return result


def mask_apply_us(vocab: int, repeats: int) -> float:
    """The engine's unpacking of a random 8-row bitmask onto 8 of 16 rows of logits."""
    logits = torch.randn(2 * BATCH, vocab)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (BATCH, (vocab + 31) // 32), dtype=torch.int32)
    rows = list(range(0, 2 * BATCH, 2))
    return 1e6 * statistics.median(
        timed(apply_bitmask, logits, rows, bitmask)[1] for _ in range(repeats)
    )


def main() -> None:
    args = bench_parser(__doc__ or "", walks=20, repeats=20).parse_args()
    folder = model_dir(args.model)
    tokenizer = Tokenizer.from_folder(folder)
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    figures: dict[str, Any] = {"model": folder.name, "vocab": vocab}
    for cls in (Llguidance, Xgrammar):
        _, import_s = timed(importlib.import_module, cls.name)
        engine, setup_s = timed(cls, folder, tokenizer, vocab)
        print(f"{cls.name}: import {import_s:.2f} s, tokenizer setup {setup_s:.2f} s", flush=True)
        result = bench_engine(engine, tokenizer, vocab, args.walks, args.repeats)
        result |= {"import_s": import_s, "tokenizer_setup_s": setup_s}
        for name, entry in result["schemas"].items():
            print(f"  {name:16s} {entry}", flush=True)
        print(
            f"  fill p50 {result['fill_us_p50']:.0f} us, accept p50 {result['accept_us_p50']:.0f}"
            f" us, batch of {BATCH} fill p50 {result['batch8_fill_us_p50']:.0f} us",
            flush=True,
        )
        print(f"  unsupported: {result['unsupported']}; bad regex: {result['bad_regex']}")
        figures[cls.name] = result
    figures["mask_apply_8_of_16_rows_us_p50"] = mask_apply_us(vocab, args.repeats)
    figures["torch_threads"] = torch.get_num_threads()
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
