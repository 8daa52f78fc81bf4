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

import json
import logging
import random
import time
from collections.abc import Callable
from collections.abc import Sequence as SequenceOf
from concurrent import futures
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from .block_manager import BlockManager
from .config import EngineConfig
from .errors import (
    DuplicateRequestError,
    InvalidRequestError,
    ModelLoadError,
    PromptTooLongError,
)
from .grammar import CompiledGrammar, GrammarCompiler
from .lora.loader import AdapterLoader, FetchAdapter
from .lora.manager import LoRAManager
from .lora.peft_rules import fingerprint_from_config
from .metrics import EngineMetrics
from .model_runner import ModelRunner
from .outputs import CompletionOutput, RequestOutput, abort_output, append_token
from .request import EngineRequest, LoRARequest
from .sampling_params import SamplingParams
from .scheduler import ScheduledBatch, Scheduler
from .scoring import ScoreResult, score_request, score_result
from .sequence import Sequence, SequenceStatus
from .structured_output import StructuredOutput
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
        self.tokenizer = Tokenizer.from_folder(self.config.model)
        if self.tokenizer.vocab_size > self.config.model_config.vocab_size:
            raise ModelLoadError(
                f"the tokenizer has {self.tokenizer.vocab_size} tokens but the model only "
                f"{self.config.model_config.vocab_size}; tokenizer.json belongs to another model"
            )
        self.model_runner = ModelRunner(self.config)
        if self.model_runner.workers is not None:  # a lost rank wakes an idle step loop
            self.model_runner.workers.on_failure = self._wake
        self.block_manager = BlockManager(
            self.model_runner.num_blocks,
            self.config.block_size,
            enable_prefix_caching=self.config.enable_prefix_caching,
            sliding_window=self.config.model_config.uniform_window,
            longrope_original=self.config.model_config.longrope_original,
        )
        self.metrics = EngineMetrics()
        self.lora_manager: LoRAManager | None = None
        if self.model_runner.lora_slots is not None:
            raw = json.loads((Path(self.config.model) / "config.json").read_text())
            served = {"architectures": [self.config.model_config.architecture]}
            loader = AdapterLoader(
                self.model_runner.lora_slots, fingerprint_from_config(raw | served), lora_loader
            )
            assert self.config.max_cpu_loras is not None  # resolved by EngineConfig
            self.lora_manager = LoRAManager(
                loader, max_cpu_loras=self.config.max_cpu_loras, metrics=self.metrics
            )
        self.scheduler = Scheduler(self.config, self.block_manager, self.lora_manager)
        self.max_model_len = self.model_runner.max_model_len
        mc = self.config.model_config
        self.eos_token_ids = frozenset(self.tokenizer.eos_token_ids) | frozenset(mc.eos_token_ids)
        # the grammars' end-of-sequence tokens are the engine's, so a JSON ends where the model would
        self.structured = GrammarCompiler(
            Path(self.config.model) / "tokenizer.json", mc.vocab_size, sorted(self.eos_token_ids)
        )
        self._awaiting_grammar: list[Sequence] = []  # added, their grammar still compiling
        self._wakeup: Callable[[], None] | None = None  # on_load_finished's callback
        # A sequence can only grow as long as the whole cache, even alone.
        self.max_seq_len = min(
            self.max_model_len, self.block_manager.num_blocks * self.config.block_size
        )
        self.requests: dict[str, Sequence] = {}
        self.num_steps = 0  # forward passes run; a step may run one and yet emit nothing
        self._aborted: list[RequestOutput] = []
        self._seeds = random.Random(self.config.seed)

    # -- requests -------------------------------------------------------------------------

    def add_request(self, request: EngineRequest) -> None:
        """Validate a request (a bad one raises an EngineError here) and queue it."""
        self.add_sequence(self.make_sequence(request))

    def make_sequence(self, request: EngineRequest) -> Sequence:
        """Validate and tokenize a request without touching the engine's state."""
        if not isinstance(request, EngineRequest):
            raise InvalidRequestError(
                f"a request must be an EngineRequest, got {type(request).__name__}"
            )
        request_id, fairness_key = request.request_id, request.fairness_key
        if not isinstance(request_id, str) or not request_id:
            raise InvalidRequestError(f"request_id must be a non-empty string, got {request_id!r}")
        self.check_lora_request(request.lora_request)
        if fairness_key is not None and not isinstance(fairness_key, str):
            raise InvalidRequestError(
                f"fairness_key must be a string or None, got {type(fairness_key).__name__}"
            )
        if isinstance(request.priority, bool) or not isinstance(request.priority, int):
            raise InvalidRequestError(f"priority must be an integer, got {request.priority!r}")
        params = request.sampling_params
        if params is None:
            params = SamplingParams()
        elif not isinstance(params, SamplingParams):
            raise InvalidRequestError("sampling_params must be a SamplingParams")
        token_ids = self._prompt_tokens(request.prompt, request.prompt_token_ids)
        self._check_length(len(token_ids))
        seq = Sequence(
            request_id,
            token_ids,
            params,
            seed=params.seed if params.seed is not None else self._seeds.getrandbits(63),
            detokenizer=self.tokenizer.detokenizer(),
            lora_request=request.lora_request,
            fairness_key=fairness_key,
            arrival_time=request.arrival_time,
            priority=request.priority,
        )
        if params.structured_output is not None:
            self._attach_grammar(seq, params.structured_output)
        return seq

    def _attach_grammar(self, seq: Sequence, spec: StructuredOutput) -> None:
        """Its matcher now if the grammar is cached, else a compile on the compiler's threads
        (the sequence waits for it). StructuredOutputUnavailableError without llguidance."""
        self.structured.check_available()
        compiled = self.structured.cached(spec)
        if compiled is not None:
            seq.grammar = compiled.matcher()
            return
        seq.grammar_future = self.structured.submit(spec)
        seq.grammar_future.add_done_callback(self._grammar_compiled)

    def _grammar_compiled(self, _: Future[CompiledGrammar]) -> None:
        if self._wakeup is not None:
            self._wakeup()

    def check_lora_request(self, lora_request: object) -> None:
        """Refuse what is not a LoRARequest, or any adapter on a base-only engine."""
        if lora_request is None:
            return
        if not isinstance(lora_request, LoRARequest):
            raise InvalidRequestError(
                f"lora_request must be a LoRARequest, got {type(lora_request).__name__}"
            )
        if self.lora_manager is None:
            raise InvalidRequestError(
                f"adapter {lora_request.name!r} was requested but this engine serves the base "
                f"model only; start it with enable_lora=True"
            )

    def add_sequence(self, seq: Sequence) -> None:
        if seq.request_id in self.requests:
            raise DuplicateRequestError(
                f"request id {seq.request_id!r} is already in use; give each request a unique id"
            )
        self.requests[seq.request_id] = seq
        self.scheduler.add(seq)
        if seq.awaiting_grammar:
            self._awaiting_grammar.append(seq)

    def _prompt_tokens(
        self, prompt: str | None, prompt_token_ids: SequenceOf[int] | None
    ) -> list[int]:
        if (prompt is None) == (prompt_token_ids is None):
            raise InvalidRequestError("give exactly one of prompt (text) and prompt_token_ids")
        if prompt_token_ids is None:
            if not isinstance(prompt, str):
                raise InvalidRequestError(f"prompt must be a string, got {type(prompt).__name__}")
            token_ids = self.tokenizer.encode(prompt) if prompt else []
        else:
            token_ids = list(prompt_token_ids)
            vocab = self.config.model_config.vocab_size
            for t in token_ids:
                if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
                    raise InvalidRequestError(
                        f"prompt token id {t!r} is not in the vocabulary (0..{vocab - 1})"
                    )
        if not token_ids:
            raise InvalidRequestError("the prompt is empty; send at least one token")
        return token_ids

    def _check_length(self, n: int) -> None:
        limit = self.max_model_len
        if n + 1 > limit:
            raise PromptTooLongError(
                f"the prompt has {n} tokens but the model's context (max_model_len) is {limit}, "
                f"which must also hold at least one generated token; shorten it to "
                f"{limit - 1} tokens or fewer"
            )
        need = self.block_manager.blocks_needed(n + 1)
        if need > self.block_manager.num_blocks:
            raise PromptTooLongError(
                f"the prompt has {n} tokens and needs {need} KV blocks, but the whole KV cache has "
                f"{self.block_manager.num_blocks} ({self.max_seq_len} tokens); shorten the prompt "
                f"or start the engine with a larger kv_cache_bytes"
            )

    def abort(self, request_id: str, error: Exception | None = None) -> bool:
        """Stop a request and free its KV blocks now. Its final output, with finish_reason
        "abort" (and `error`, if given), comes from the next `step()`. False if no such
        request is unfinished."""
        seq = self.requests.pop(request_id, None)
        if seq is None:
            return False
        self.scheduler.finish(seq)
        seq.finish_reason = "abort"
        self._record_finish(seq, time.monotonic())
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
                max_len=self.max_seq_len,
                complete=complete,
            )
            self._record_token(seq, now)
            if out.finished:
                self.scheduler.finish(seq)
                del self.requests[seq.request_id]
                self._record_finish(seq, now)
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

    def _record_token(self, seq: Sequence, now: float) -> None:
        m = self.metrics
        m.generation_tokens += 1
        if seq.first_token_time is None:
            seq.first_token_time = now
            m.time_to_first_token.observe(now - seq.arrival_time)
        elif seq.last_token_time is not None:
            m.inter_token_latency.observe(now - seq.last_token_time)
        seq.last_token_time = now

    def _record_finish(self, seq: Sequence, now: float) -> None:
        assert seq.finish_reason is not None
        self.metrics.finished[seq.finish_reason] += 1
        self.metrics.e2e_latency.observe(now - seq.arrival_time)

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
            **self.metrics.snapshot(),
        }
        if self.lora_manager is not None:
            stats["lora"] = self.lora_manager.stats()
        return stats

    # -- LoRA adapters ------------------------------------------------------------------------

    def load_lora(self, lora_request: LoRARequest, pin: bool = False) -> Future[None]:
        """Load an adapter into host memory ahead of its requests (with `pin`, also keep it
        in a device slot). The future resolves once it is there (steps resolve it), or
        raises AdapterLoadError."""
        self.check_lora_request(lora_request)
        if lora_request is None:
            raise InvalidRequestError("load_lora needs a LoRARequest")
        return self._lora().load(lora_request, pin=pin)

    def unload_lora(self, adapter_id: str) -> bool:
        """Drop an adapter from its slot and host memory; False if the engine does not know
        it. Refused (InvalidRequestError) while requests use it. Its cached KV blocks go too."""
        unloaded = self._lora().unload(adapter_id)
        self.block_manager.drop_adapter(adapter_id)
        return unloaded

    def pin_lora(self, adapter_id: str, pinned: bool = True) -> None:
        """Keep a known adapter resident in a device slot (never evicted) until unpinned."""
        self._lora().pin(adapter_id, pinned)

    def list_loras(self) -> list[dict[str, Any]]:
        """Every adapter the engine knows: name, adapter_id, path, tier (device, host or
        disk), slot, pinned, loading, rank, running and waiting request counts."""
        return self._lora().list_loras()

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

    def _lora(self) -> LoRAManager:
        if self.lora_manager is None:
            raise InvalidRequestError("this engine serves no adapters; start it with enable_lora")
        return self.lora_manager

    # -- blocking convenience ---------------------------------------------------------------

    def score(
        self,
        prompt_token_ids: list[int],
        completion_token_ids: list[int],
        lora_request: LoRARequest | None = None,
    ) -> ScoreResult:
        """log P(completion | prompt) under the adapter (or the base model), on an otherwise
        idle engine; see AsyncLLMEngine.score for a serving engine."""
        request = score_request(
            f"score-{id(prompt_token_ids)}", prompt_token_ids, completion_token_ids, lora_request
        )
        assert request.prompt_token_ids is not None
        [out] = self.generate(
            [request.prompt_token_ids], request.sampling_params, request.lora_request
        )
        if out.error is not None:
            raise out.error
        return score_result(out.prompt_logprobs, len(prompt_token_ids))

    def generate(
        self,
        prompts: SequenceOf[str | list[int]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        lora_request: LoRARequest | list[LoRARequest | None] | None = None,
    ) -> list[CompletionOutput]:
        """Run prompts (texts or token id lists) to completion on an otherwise idle engine
        (tests, benchmarks); results in prompt order. A prompt whose adapter cannot be
        loaded ends with finish_reason "abort" and the error in `error`."""
        if self.requests:
            raise RuntimeError("generate() steps the whole engine; call it only when idle")
        params: list[SamplingParams | None] = (
            list(sampling_params)
            if isinstance(sampling_params, list)
            else [sampling_params] * len(prompts)
        )
        loras: list[LoRARequest | None] = (
            list(lora_request) if isinstance(lora_request, list) else [lora_request] * len(prompts)
        )
        if len(params) != len(prompts) or len(loras) != len(prompts):
            raise InvalidRequestError(
                f"{len(prompts)} prompts but {len(params)} sampling params and "
                f"{len(loras)} LoRA requests"
            )
        seqs = [
            self.make_sequence(
                EngineRequest(
                    f"generate-{id(params)}-{i}",
                    p if isinstance(p, str) else None,
                    sp,
                    prompt_token_ids=None if isinstance(p, str) else list(p),
                    lora_request=lora,
                )
            )
            for i, (p, sp, lora) in enumerate(zip(prompts, params, loras, strict=True))
        ]  # all validated before any is queued, so a bad prompt leaves nothing behind
        results = {
            seq.request_id: CompletionOutput(seq.request_id, list(seq.token_ids)) for seq in seqs
        }
        for seq in seqs:
            self.add_sequence(seq)
        while any(r.finish_reason is None for r in results.values()):
            steps = self.num_steps
            outputs = self.step()
            if not outputs and self.num_steps == steps:  # only adapter loads are in progress
                self.wait_for_load(0.05)
            for out in outputs:
                result = results.get(out.request_id)
                if result is None:
                    continue
                result.token_ids += out.new_token_ids
                result.text += out.new_text
                result.logprobs += out.new_logprobs
                if out.prompt_logprobs is not None:
                    result.prompt_logprobs = out.prompt_logprobs
                result.finish_reason = out.finish_reason
                result.error = out.error
        return list(results.values())
