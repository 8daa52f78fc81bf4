"""Where a request enters the engine: every check its input must pass (a bad one raises an
EngineError saying what to fix), its prompt tokenized, its seed drawn and its grammar looked
up or sent to compile. Nothing here touches the engine's state, so any thread may call it."""

import random
from collections.abc import Callable
from collections.abc import Sequence as SequenceOf

from .block_manager import BlockManager
from .errors import InvalidRequestError, PromptTooLongError
from .grammar import GrammarCompiler
from .request import EngineRequest
from .sampling_params import SamplingParams
from .sequence import Sequence
from .structured_output import StructuredOutput
from .tokenizer import Tokenizer


class RequestIntake:
    def __init__(
        self,
        tokenizer: Tokenizer,
        block_manager: BlockManager,
        structured: GrammarCompiler,
        *,
        vocab_size: int,
        max_model_len: int,
        max_seq_len: int,
        eos_token_ids: frozenset[int],
        seed: int,
        check_lora_request: Callable[[object], None],
        on_grammar_compiled: Callable[[], None],
    ):
        """`check_lora_request` refuses an adapter the engine cannot serve;
        `on_grammar_compiled` runs on a compiler thread when a request's grammar is ready."""
        self.tokenizer = tokenizer
        self.block_manager = block_manager
        self.structured = structured
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.max_seq_len = max_seq_len
        self.eos_token_ids = eos_token_ids
        self.check_lora_request = check_lora_request
        self.on_grammar_compiled = on_grammar_compiled
        self._seeds = random.Random(seed)  # for requests that give no seed of their own

    def make_sequence(self, request: EngineRequest) -> Sequence:
        """Validate and tokenize a request."""
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
        model_name = request.model_name
        if model_name is not None and not (isinstance(model_name, str) and model_name):
            raise InvalidRequestError(
                f"model_name must be a non-empty string or None, got {model_name!r}"
            )
        params = request.sampling_params
        if params is None:
            params = SamplingParams()
        elif not isinstance(params, SamplingParams):
            raise InvalidRequestError("sampling_params must be a SamplingParams")
        self._check_token_ids(params)
        token_ids = self._prompt_tokens(request.prompt, request.prompt_token_ids)
        self._check_length(len(token_ids), request.lora_request is not None)
        seq = Sequence(
            request_id,
            token_ids,
            params,
            seed=params.seed if params.seed is not None else self._seeds.getrandbits(63),
            detokenizer=self.tokenizer.detokenizer(params.skip_special_tokens),
            lora_request=request.lora_request,
            fairness_key=fairness_key,
            arrival_time=request.arrival_time,
            priority=request.priority,
            model_name=model_name,
            eos_token_ids=self.eos_token_ids,
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
        seq.grammar_future.add_done_callback(lambda _: self.on_grammar_compiled())

    def _check_token_ids(self, params: SamplingParams) -> None:
        """The sampling parameters' token ids index the logits: each must be in the vocabulary."""
        vocab = self.vocab_size
        for name, ids in (
            ("logit_bias", params.logit_bias),
            ("stop_token_ids", params.stop_token_ids),
        ):
            outside = sorted(t for t in ids if t >= vocab)
            if outside:
                raise InvalidRequestError(
                    f"{name} has token id {outside[0]}, which is not in the vocabulary "
                    f"(0..{vocab - 1})"
                )

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
            vocab = self.vocab_size
            for t in token_ids:
                if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
                    raise InvalidRequestError(
                        f"prompt token id {t!r} is not in the vocabulary (0..{vocab - 1})"
                    )
        if not token_ids:
            raise InvalidRequestError("the prompt is empty; send at least one token")
        return token_ids

    def _check_length(self, n: int, with_adapter: bool) -> None:
        limit = self.max_model_len
        if n + 1 > limit:
            raise PromptTooLongError(
                f"the prompt has {n} tokens but the model's context (max_model_len) is {limit}, "
                f"which must also hold at least one generated token; shorten it to "
                f"{limit - 1} tokens or fewer"
            )
        need = self.block_manager.blocks_needed(n + 1)
        room = self.block_manager.max_seq_blocks(with_adapter)
        if need > room:
            beside = " beside its adapter's slot" if with_adapter else ""
            raise PromptTooLongError(
                f"the prompt has {n} tokens and needs {need} KV blocks, but the whole KV cache has "
                f"{room} ({room * self.block_manager.block_size} tokens){beside}; shorten the "
                f"prompt or start the engine with a larger kv_cache_bytes"
            )
