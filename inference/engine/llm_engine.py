"""LLMEngine: requests in, one step at a time, token deltas out.

Not thread-safe: one thread calls `add_request`/`step`/`abort` and the LoRA controls
(AsyncLLMEngine is that thread's owner). `make_sequence` only validates, tokenizes and looks
up or starts its grammar, `structured.compile` is thread-safe, and `stats`/`list_loras`
only read, so other threads may call those.

Structured outputs: a request's grammar comes from the cache at once, or is compiled on the
grammar compiler's threads while the request waits (never on the step thread); a schema
that fails to compile there ends only its request, with finish_reason "abort" and the
error. The request stops ("stop") as soon as its JSON is whole.
"""

import logging
import time
from collections.abc import Callable
from collections.abc import Sequence as SequenceOf
from concurrent import futures
from concurrent.futures import Future
from pathlib import Path
from typing import Any, cast

from . import blocking
from .block_manager import BlockManager
from .config import EngineConfig
from .emulation import EmulatedModelRunner
from .errors import DuplicateRequestError, ModelLoadError
from .grammar import GrammarCompiler
from .lora.loader import FetchAdapter
from .lora_controls import LoRAControls, make_lora_manager
from .metrics import EngineMetrics
from .model_runner import ModelRunner
from .outputs import CompletionOutput, RequestOutput, abort_output, append_token
from .request import EngineRequest, LoRARequest
from .request_intake import RequestIntake
from .sampling_params import SamplingParams
from .scheduler import ScheduledBatch, Scheduler
from .scoring import ScoreResult
from .sequence import Sequence, SequenceStatus
from .tokenizer import Tokenizer

WAITING = SequenceStatus.WAITING
logger = logging.getLogger(__name__)


class LLMEngine:
    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        lora_loader: FetchAdapter | None = None,
        **kwargs: Any,
    ):
        """`lora_loader(lora_request) -> local folder` fetches an adapter that is not on local
        disk (path None or missing); it runs on a loader thread, never the step thread. It
        is unused when the config does not enable LoRA."""
        if config is not None and kwargs:
            raise TypeError("pass either an EngineConfig or keyword settings, not both")
        self.config = config if config is not None else EngineConfig(**kwargs)
        mc = self.config.model_config
        self.tokenizer = _load_tokenizer(self.config)
        # the emulated runner stands in for ModelRunner: it has what this engine calls
        self.model_runner: ModelRunner = (
            ModelRunner(self.config)
            if self.config.emulate_device is None
            else cast(
                ModelRunner,
                EmulatedModelRunner(self.config, frozenset(self.tokenizer.eos_token_ids)),
            )
        )
        if self.model_runner.workers is not None:  # a lost rank wakes an idle step loop
            self.model_runner.workers.on_failure = self._wake
        self.block_manager = BlockManager(
            self.model_runner.num_blocks,
            self.config.block_size,
            enable_prefix_caching=self.config.enable_prefix_caching,
            sliding_window=mc.uniform_window,
            longrope_original=mc.longrope_original,
            layout=self.model_runner.pool,
            reserve_slots=self.config.reserve_lora_slots,
        )
        self.metrics = EngineMetrics()
        self.lora_manager = make_lora_manager(
            self.config, self.model_runner.lora_slots, lora_loader, self.metrics
        )
        if self.lora_manager is not None:  # the slots live in the block manager's pool
            self.lora_manager.attach_pool(
                self.block_manager, self.model_runner.pool, self.model_runner.copy_pages
            )
        if self.lora_manager is not None and self.model_runner.workers is not None:
            self.lora_manager.loader.ranks = self.model_runner.workers.loads  # every rank loads
        self.scheduler = Scheduler(self.config, self.block_manager, self.lora_manager)
        self.max_model_len = self.model_runner.max_model_len
        self.eos_token_ids = frozenset(self.tokenizer.eos_token_ids) | frozenset(mc.eos_token_ids)
        # the grammars end on the engine's end-of-sequence tokens: a JSON ends where the model would
        self.structured = GrammarCompiler(
            Path(self.config.model) / "tokenizer.json", mc.vocab_size, sorted(self.eos_token_ids)
        )
        self._awaiting_grammar: list[Sequence] = []  # added, their grammar still compiling
        self._wakeup: Callable[[], None] | None = None  # on_load_finished's callback
        # A sequence can only grow as long as the whole cache, even alone (beside its
        # adapter's slot group when it has one: max_seq_blocks).
        self.max_seq_len = min(
            self.max_model_len, self.block_manager.max_seq_blocks() * self.config.block_size
        )
        self.max_adapter_seq_len = min(
            self.max_model_len, self.block_manager.max_seq_blocks(True) * self.config.block_size
        )
        self.loras = LoRAControls(
            self.lora_manager, self.block_manager, (self.max_seq_len, self.max_adapter_seq_len)
        )
        self.intake = RequestIntake(
            self.tokenizer,
            self.block_manager,
            self.structured,
            vocab_size=mc.vocab_size,
            max_model_len=self.max_model_len,
            max_seq_len=self.max_seq_len,
            eos_token_ids=self.eos_token_ids,
            seed=self.config.seed,
            check_lora_request=self.loras.check_request,
            on_grammar_compiled=self._wake,
        )
        self.requests: dict[str, Sequence] = {}
        self.num_steps = 0  # forward passes run; a step may run one and yet emit nothing
        self._aborted: list[RequestOutput] = []

    # -- requests -------------------------------------------------------------------------

    def add_request(self, request: EngineRequest) -> None:
        """Validate a request (a bad one raises an EngineError here) and queue it."""
        self.add_sequence(self.make_sequence(request))

    def make_sequence(self, request: EngineRequest) -> Sequence:
        """Validate and tokenize a request without touching the engine's state."""
        return self.intake.make_sequence(request)

    def check_lora_request(self, lora_request: object) -> None:
        """Refuse what is not a LoRARequest, or any adapter on a base-only engine."""
        self.loras.check_request(lora_request)

    def add_sequence(self, seq: Sequence) -> None:
        if seq.request_id in self.requests:
            raise DuplicateRequestError(
                f"request id {seq.request_id!r} is already in use; give each request a unique id"
            )
        self.requests[seq.request_id] = seq
        self.scheduler.add(seq)
        if seq.awaiting_grammar:
            self._awaiting_grammar.append(seq)

    def abort(self, request_id: str, error: Exception | None = None) -> bool:
        """Stop a request and free its KV blocks now. Its final output, with finish_reason
        "abort" (and `error`, if given), comes from the next `step()`. False if no such
        request is unfinished."""
        seq = self.requests.pop(request_id, None)
        if seq is None:
            return False
        self.scheduler.finish(seq)
        seq.finish_reason = "abort"
        self.metrics.observe_finish(seq, time.monotonic())
        self._aborted.append(abort_output(seq, error))
        return True

    def has_unfinished(self) -> bool:
        """Requests to serve, outputs to hand over, or adapters loading. Raises
        RankFailedError once a rank of a tensor-parallel engine is lost."""
        self.model_runner.check_ranks()
        return bool(
            self.requests
            or self._aborted
            or (self.lora_manager is not None and self.lora_manager.busy())
        )

    # -- the loop -------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        if self.lora_manager is not None:
            for adapter_id, error in self.lora_manager.poll():
                self._fail_adapter(adapter_id, error)
        if self._awaiting_grammar:
            self._poll_grammars()
        outputs, self._aborted = self._aborted, []
        return outputs + self.run_batch(self.scheduler.schedule())

    def run_batch(self, batch: ScheduledBatch) -> list[RequestOutput]:
        """Run one scheduled batch and turn its sampled tokens into outputs."""
        outputs: list[RequestOutput] = []
        if not batch:
            return outputs
        start = time.monotonic()
        for seq in batch.seqs:
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = start
                self.metrics.queue_time.observe(start - seq.arrival_time)
                self.metrics.prompt_tokens += seq.num_prompt_tokens
        seqs, sampled = self.model_runner.run(batch)
        self.num_steps += 1
        self.scheduler.mark_computed(batch)
        now = time.monotonic()
        for seq, token_id, logprob in zip(seqs, sampled.token_ids, sampled.logprobs, strict=True):
            complete = False
            if seq.grammar is not None:
                if not seq.grammar.accept(token_id):
                    self._fail_grammar(seq, token_id)
                    continue
                complete = seq.grammar.is_complete
            out = append_token(
                seq,
                token_id,
                logprob,
                eos_token_ids=self.eos_token_ids,
                max_len=self.max_seq_len if seq.lora_request is None else self.max_adapter_seq_len,
                complete=complete,
            )
            self.metrics.observe_token(seq, now)
            if out.finished:
                self.scheduler.finish(seq)
                del self.requests[seq.request_id]
                self.metrics.observe_finish(seq, now)
            outputs.append(out)
        self.metrics.preemptions = self.scheduler.num_preemptions
        return outputs

    def _fail_adapter(self, adapter_id: str, error: Exception) -> None:
        """An adapter failed to load: fail the requests waiting for it, and only those."""
        for seq in list(self.requests.values()):
            lora = seq.lora_request
            if lora is not None and lora.adapter_id == adapter_id and seq.status is WAITING:
                self.abort(seq.request_id, error)

    def _poll_grammars(self) -> None:
        """Give each waiting sequence whose grammar has compiled its matcher (it may now be
        admitted), and end those whose schema failed to compile."""
        awaiting, self._awaiting_grammar = self._awaiting_grammar, []
        for seq in awaiting:
            future = seq.grammar_future
            if seq.is_finished or future is None:
                continue  # aborted meanwhile
            if not future.done():
                self._awaiting_grammar.append(seq)
                continue
            seq.grammar_future = None
            error = future.exception()
            if error is None:
                seq.grammar = future.result().matcher()
            else:
                assert isinstance(error, Exception)  # GrammarCompiler passes on Exceptions only
                self.abort(seq.request_id, error)

    def _fail_grammar(self, seq: Sequence, token_id: int) -> None:
        """The grammar refused a token its own mask allowed: a bug, not the caller's doing;
        only that request ends."""
        assert seq.grammar is not None
        logger.error(
            "request %s: token %d broke its grammar: %s",
            seq.request_id,
            token_id,
            seq.grammar.error,
        )
        self.abort(
            seq.request_id, RuntimeError(f"the structured output failed: {seq.grammar.error}")
        )

    def stats(self) -> dict[str, Any]:
        """Gauges of the moment plus the cumulative metrics."""
        stats = {
            "requests_running": len(self.scheduler.running),
            "requests_waiting": len(self.scheduler.waiting),
            "kv_blocks_used": self.block_manager.num_used_blocks,
            "kv_blocks_total": self.block_manager.num_blocks,
            "prefix_cache_queries": self.block_manager.stats.queries,
            "prefix_cache_hits": self.block_manager.stats.hits,
            "prefix_cache_blocks": self.block_manager.num_cached_blocks,
            "weights_bytes": self.model_runner.weights_bytes,
            "engine_info": self.model_runner.engine_info(),
            # CPU decode: tokens whose keys and values were copied from the cache into the
            # decode buffers, and moved within them as they grew
            "decode_kv_copied_tokens": self.model_runner.kv_copies.total_copied,
            "decode_kv_moved_tokens": self.model_runner.kv_copies.total_moved,
            "pool": self.pool_stats(),
            **self.metrics.snapshot(),
        }
        if self.lora_manager is not None:
            stats["lora"] = self.lora_manager.stats()
        if isinstance(self.model_runner, EmulatedModelRunner):
            device = self.model_runner.device
            stats["emulated_device"] = {"busy_seconds": device.busy_seconds, "steps": device.steps}
        return stats

    def pool_stats(self) -> dict[str, Any]:
        """The pool's pages by use (they add up to `pages`) and its resize and eviction
        counts (memory_pool.py)."""
        bm = self.block_manager
        adapters = (
            self.lora_manager.pool_pages()
            if self.lora_manager is not None
            else {"adapters_in_use": 0, "adapters_idle": 0}
        )
        free, cached = len(bm.free_blocks), len(bm.cached_free)
        lent = adapters["adapters_in_use"] + adapters["adapters_idle"]
        return {
            "pages": bm.num_blocks,
            "pages_per_slot": bm.layout.pages_per_slot,
            "by_use": {
                "running_kv": bm.num_blocks - free - cached - lent,
                "cached_prefixes": cached,
                **adapters,
                "free": free,
            },
            **self.metrics.pool_counters(),
        }

    # -- LoRA adapters ------------------------------------------------------------------------

    def load_lora(self, lora_request: LoRARequest, pin: bool = False) -> Future[None]:
        """Load an adapter into host memory ahead of its requests (with `pin`, also keep it
        in a device slot). The future resolves once it is there (steps resolve it), or
        raises AdapterLoadError."""
        return self.loras.load(lora_request, pin)

    def unload_lora(self, adapter_id: str) -> bool:
        """Drop an adapter from its slot and host memory; False if the engine does not know
        it. Refused (InvalidRequestError) while requests use it. Its cached KV blocks go too."""
        return self.loras.unload(adapter_id)

    def pin_lora(self, adapter_id: str, pinned: bool = True) -> None:
        """Keep a known adapter resident in a device slot (never evicted) until unpinned."""
        self.loras.pin(adapter_id, pinned)

    def list_loras(self) -> list[dict[str, Any]]:
        """Every adapter the engine knows: name, adapter_id, path, tier (device, host or
        disk), slot, pinned, loading, rank, running and waiting request counts."""
        return self.loras.list_loras()

    def wait_for_load(self, timeout: float) -> bool:
        """Block until a grammar compile or an adapter load finishes or `timeout` passes; for
        callers that step the engine themselves and have nothing to run meanwhile."""
        compiling = [f for s in self._awaiting_grammar if (f := s.grammar_future) is not None]
        if compiling:
            done, _ = futures.wait(compiling, timeout, return_when=futures.FIRST_COMPLETED)
            return bool(done)
        return self.lora_manager is not None and self.lora_manager.wait_for_load(timeout)

    def on_load_finished(self, callback: Callable[[], None]) -> None:
        """Call `callback` (from a loader or compiler thread) whenever an adapter load or a
        grammar compile ends, so a step loop asleep while requests wait can wake up."""
        self._wakeup = callback
        if self.lora_manager is not None:
            self.lora_manager.loader.wakeup = callback

    def _wake(self) -> None:
        wakeup = getattr(self, "_wakeup", None)  # the watchdog may fire during __init__
        if wakeup is not None:
            wakeup()

    def close(self) -> None:
        """Stop the adapter loader and grammar compiler threads (and the other ranks of a
        tensor-parallel engine)."""
        self.structured.close()
        if self.lora_manager is not None:
            self.lora_manager.shutdown()
        self.model_runner.close()

    # -- blocking convenience ---------------------------------------------------------------

    def score(
        self,
        prompt_token_ids: list[int],
        completion_token_ids: list[int],
        lora_request: LoRARequest | None = None,
    ) -> ScoreResult:
        """log P(completion | prompt) under the adapter (or the base model), on an otherwise
        idle engine; see AsyncLLMEngine.score for a serving engine."""
        return blocking.score(self, prompt_token_ids, completion_token_ids, lora_request)

    def generate(
        self,
        prompts: SequenceOf[str | list[int]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        lora_request: LoRARequest | list[LoRARequest | None] | None = None,
    ) -> list[CompletionOutput]:
        """Run prompts (texts or token id lists) to completion on an otherwise idle engine
        (tests, benchmarks); results in prompt order. A prompt whose adapter cannot be
        loaded ends with finish_reason "abort" and the error in `error`."""
        return blocking.generate(self, prompts, sampling_params, lora_request)


def _load_tokenizer(config: EngineConfig) -> Tokenizer:
    """The model folder's tokenizer, refused when it has tokens the model has no row for."""
    tokenizer = Tokenizer.from_folder(config.model)
    vocab_size = config.model_config.vocab_size
    if tokenizer.vocab_size > vocab_size:
        raise ModelLoadError(
            f"the tokenizer has {tokenizer.vocab_size} tokens but the model only "
            f"{vocab_size}; tokenizer.json belongs to another model"
        )
    return tokenizer
