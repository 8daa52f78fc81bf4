"""Structured outputs: JSON schemas compiled into token grammars, and one matcher per request.

Built on llguidance, picked over xgrammar by bench/grammar_engines.py: it refuses the
schema keywords it cannot enforce (xgrammar ignores them and lets invalid JSON through),
compiles a schema in about a millisecond, and needs nothing but its own wheel (xgrammar
imports transformers). It is imported on first use, so an engine without it still serves
every unconstrained request and refuses constrained ones with
StructuredOutputUnavailableError.

`GrammarCompiler.compile` is thread-safe, cached per StructuredOutput (LRU) and may take
milliseconds: callers run it off the step thread, the serving layer while it prepares a
request (so a bad schema is a 400 before the engine sees it), the engine on its own
compile threads (`submit`) for a request whose grammar is not cached yet.
"""

import re
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from .errors import StructuredOutputUnavailableError, UnsupportedSchemaError
from .structured_output import StructuredOutput

# One JSON layout for every output, as json.dumps writes it. Free whitespace would let a
# model pad its answer with newlines until max_tokens runs out.
JSON_FORMAT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
MAX_CACHED_GRAMMARS = 256
COMPILE_THREADS = 2


def import_llguidance() -> ModuleType:
    try:
        import llguidance
    except ImportError as e:
        raise StructuredOutputUnavailableError(
            "structured outputs (a JSON schema or JSON object response format) are not "
            "available on this server: its engine lacks the llguidance package; send the "
            "request without one"
        ) from e
    return llguidance


class GrammarMatcher:
    """One request's place in its grammar. It lives on the Sequence, so a preempted
    request keeps it: recomputing the KV cache feeds no token to the grammar again."""

    __slots__ = ("backend", "matcher")

    def __init__(self, backend: "GrammarBackend", matcher: Any):
        self.backend = backend
        self.matcher = matcher  # an llguidance.LLMatcher

    def accept(self, token_id: int) -> bool:
        """Advance by a sampled token; False if the grammar does not allow it."""
        return bool(self.matcher.consume_token(token_id))

    @property
    def is_complete(self) -> bool:
        """The output is whole: nothing but an end-of-sequence token may follow."""
        return bool(self.matcher.is_stopped())

    @property
    def error(self) -> str:
        """The matcher's complaint in a line (it can quote the grammar whole)."""
        return _first_words(str(self.matcher.get_error()))


class CompiledGrammar:
    """A StructuredOutput's grammar, ready to hand out matchers: a matcher at the start
    whose first mask was computed once (so its lexer is built), copied for each request."""

    def __init__(self, backend: "GrammarBackend", start: Any):
        self._backend = backend
        self._start = start

    def matcher(self) -> GrammarMatcher:
        return GrammarMatcher(self._backend, self._start.deep_copy())


class GrammarBackend:
    """llguidance's view of the model's tokenizer, and the executor that fills the token
    masks of a batch in parallel. Built once, on the first compile."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_token_ids: list[int]):
        self.llg = import_llguidance()
        # n_vocab is the model's logits width: ids past the tokenizer (padding) are never allowed
        self.tokenizer = self.llg.LLTokenizer(
            tokenizer_json, n_vocab=vocab_size, eos_token=eos_token_ids
        )
        self.executor = self.llg.LLExecutor()
        self.vocab_size = vocab_size
        self.mask_words = (vocab_size + 31) // 32  # int32 words of one row's bitmask

    def compile(self, spec: StructuredOutput) -> CompiledGrammar:
        start = self._start(spec)
        if start.is_error():
            raise UnsupportedSchemaError(_schema_problem(start.get_error()))
        # one mask, on this thread, builds the lexer states every copy then shares
        scratch = torch.empty(self.mask_words, dtype=torch.int32)
        start.unsafe_compute_mask_ptr(scratch.data_ptr(), self.mask_words * 4)
        if start.is_stopped():  # nothing, not even `{}`, is a value of it (`{"$ref": "#"}`)
            raise UnsupportedSchemaError("the JSON schema admits no JSON value")
        return CompiledGrammar(self, start)

    def _start(self, spec: StructuredOutput) -> Any:
        """The grammar's first matcher. What the grammar engine raises on a schema it
        cannot take (a number it cannot hold, a limit of its own, even a panic of its Rust
        core) is the schema's problem, said in a line."""
        try:
            grammar = self.llg.LLMatcher.grammar_from_json_schema(
                spec.schema(), overrides=JSON_FORMAT
            )
            return self.llg.LLMatcher(self.tokenizer, grammar, log_level=0)
        except BaseException as error:  # pyo3's PanicException derives from BaseException
            if isinstance(error, KeyboardInterrupt | SystemExit | GeneratorExit):
                raise
            if type(error).__name__ == "PanicException":  # its text is the engine's internals
                raise UnsupportedSchemaError(
                    "the grammar engine could not compile this JSON schema (too large or too "
                    "complex); simplify it"
                ) from None
            raise UnsupportedSchemaError(_schema_problem(str(error))) from None

    def fill_bitmask(self, matchers: list[Any]) -> torch.Tensor:
        """The allowed next tokens of each llguidance matcher, one int32 bitmask row each
        (bit j of word w allows token 32 * w + j), computed in parallel."""
        bitmask = torch.empty((len(matchers), self.mask_words), dtype=torch.int32)
        self.executor.unsafe_compute_mask_ptr(
            [(m, row) for row, m in enumerate(matchers)],
            bitmask.data_ptr(),
            self.mask_words * 4,
            len(matchers),
        )
        return bitmask


class GrammarCompiler:
    """Compiles StructuredOutputs for one engine's tokenizer, keeping the most recent
    MAX_CACHED_GRAMMARS; a schema asked for by several requests at once compiles once."""

    def __init__(
        self,
        tokenizer_file: str | Path,
        vocab_size: int,
        eos_token_ids: list[int],
        max_cached: int = MAX_CACHED_GRAMMARS,
    ):
        self._tokenizer_file = Path(tokenizer_file)
        self._vocab_size = vocab_size
        self._eos_token_ids = list(eos_token_ids)
        self._max_cached = max_cached
        self._lock = threading.Lock()
        self._backend: GrammarBackend | None = None
        self._backend_lock = threading.Lock()  # held while building it (half a second)
        self._cache: OrderedDict[StructuredOutput, CompiledGrammar] = OrderedDict()
        self._compiling: dict[StructuredOutput, Future[CompiledGrammar]] = {}
        self._pool: ThreadPoolExecutor | None = None

    def check_available(self) -> None:
        """Raise StructuredOutputUnavailableError if this server cannot constrain outputs."""
        import_llguidance()

    def cached(self, spec: StructuredOutput) -> CompiledGrammar | None:
        with self._lock:
            compiled = self._cache.get(spec)
            if compiled is not None:
                self._cache.move_to_end(spec)
            return compiled

    def compile(self, spec: StructuredOutput) -> CompiledGrammar:
        """The spec's grammar, compiled now in this thread unless cached or under way.
        Raises UnsupportedSchemaError (naming what is wrong) or
        StructuredOutputUnavailableError."""
        future, mine = self._claim(spec)
        if mine:
            self._run(spec, future)
        return future.result()

    def submit(self, spec: StructuredOutput) -> "Future[CompiledGrammar]":
        """The spec's grammar, compiled on one of the compiler's own threads."""
        future, mine = self._claim(spec)
        if mine:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(COMPILE_THREADS, "loraplex-grammar")
                pool = self._pool
            pool.submit(self._run, spec, future)
        return future

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def _claim(self, spec: StructuredOutput) -> "tuple[Future[CompiledGrammar], bool]":
        """(the future of the spec's grammar, whether the caller must compile it)."""
        if not isinstance(spec, StructuredOutput):
            raise TypeError(f"compile() takes a StructuredOutput, got {type(spec).__name__}")
        with self._lock:
            compiled = self._cache.get(spec)
            if compiled is not None:
                self._cache.move_to_end(spec)
                done: Future[CompiledGrammar] = Future()
                done.set_result(compiled)
                return done, False
            future = self._compiling.get(spec)
            if future is not None:
                return future, False
            future = self._compiling[spec] = Future()
            return future, True

    def _run(self, spec: StructuredOutput, future: "Future[CompiledGrammar]") -> None:
        try:
            compiled = self._get_backend().compile(spec)
        except Exception as e:
            with self._lock:
                del self._compiling[spec]
            future.set_exception(e)
            return
        with self._lock:
            del self._compiling[spec]
            self._cache[spec] = compiled
            while len(self._cache) > self._max_cached:
                self._cache.popitem(last=False)
        future.set_result(compiled)

    def _get_backend(self) -> GrammarBackend:
        with self._backend_lock:
            if self._backend is None:
                self._backend = GrammarBackend(
                    self._tokenizer_file.read_text(encoding="utf-8"),
                    self._vocab_size,
                    self._eos_token_ids,
                )
            return self._backend


def _schema_problem(error: str) -> str:
    """llguidance's compile error in a caller's words."""
    unimplemented = re.match(r"Unimplemented keys: \[(.*)\]", error)
    if unimplemented:
        keys = [k.strip().strip('"') for k in unimplemented.group(1).split(",")]
        return (
            f"the JSON schema uses unsupported feature(s): {', '.join(repr(k) for k in keys)}; "
            f"remove them (describe the constraint in the prompt instead)"
        )
    unknown_format = re.match(r"Unknown format: (.*)", error)
    if unknown_format:
        return f"the JSON schema uses an unsupported string format: {unknown_format.group(1)!r}"
    return f"the JSON schema is invalid or not supported: {_first_words(error)}"


MAX_PROBLEM_CHARS = 200  # a grammar engine's message can quote the whole grammar


def _first_words(error: str) -> str:
    """The message's first line, without a backtrace or a build path, cut short."""
    lines = [line.strip() for line in error.splitlines() if line.strip()] or ["no reason given"]
    first = re.sub(r"(/[\w.-]+)+\.rs(:\d+)*", "<source>", lines[0])
    return first if len(first) <= MAX_PROBLEM_CHARS else first[:MAX_PROBLEM_CHARS] + "..."
