"""One request as the engine tracks it: its tokens, its KV blocks and its progress."""

import time
from concurrent.futures import Future
from enum import Enum, auto
from typing import TYPE_CHECKING

from .request import LoRARequest
from .sampling_params import SamplingParams

if TYPE_CHECKING:
    from .grammar import CompiledGrammar, GrammarMatcher
    from .logprobs import TokenLogprob
    from .tokenizer import IncrementalDetokenizer


class SequenceStatus(Enum):
    WAITING = auto()  # queued, or preempted and holding no KV blocks
    RUNNING = auto()  # holds KV blocks for all its tokens; prefilling or decoding
    FINISHED = auto()


class Sequence:
    """Prompt and completion tokens in one list, so a preempted sequence is recomputed by
    prefilling that list again; only `num_prompt_tokens` tells the two parts apart.

    `num_computed_tokens` counts the tokens whose keys and values are in the cache (found
    there or computed): a running sequence is prefilling while that is short of all its
    tokens but the last, and decoding once only the newest token is left to feed."""

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        seed: int,
        detokenizer: "IncrementalDetokenizer",
        lora_request: LoRARequest | None = None,
        fairness_key: str | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
        model_name: str | None = None,
        eos_token_ids: frozenset[int] = frozenset(),
    ):
        self.request_id = request_id
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.token_ids)
        self.params = params
        self.lora_request = lora_request  # None: the base model
        self.model_name = model_name  # what the client called it, for routers (request.py)
        self.lora_slot = -1  # device slot of its adapter while running; -1: none
        self.fairness_key = fairness_key  # the scheduler takes turns between keys (tenants)
        self.seed = seed  # its sampling noise is a function of this and the token index
        self.detokenizer = detokenizer
        # what it may not sample before min_tokens: its stop tokens, the model's end unless
        # ignored (logits_processors.py)
        held = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
        self.held_token_ids = sorted(held) if params.min_tokens else []
        self.status = SequenceStatus.WAITING
        self.priority = priority  # lower first (request.py)
        self.block_table: list[int] = []
        self.block_hashes: list[bytes] = []  # names of its full blocks (block_manager.py)
        self.hash_root: bytes | None = None  # the chain root those names grow from
        self.cached_long_rope: bool | None = None  # LongRoPE factors of its cached keys
        self.num_committed_blocks = 0  # leading blocks offered to the prefix cache
        self.num_released_blocks = 0  # leading blocks let go behind a sliding window
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # found in the prefix cache when last admitted
        self.admitted_order = 0  # when it was last admitted; the newest is preempted first
        self.prompt_logprobs: list[TokenLogprob | None] = []  # with params.prompt_logprobs
        self.num_preemptions = 0
        self.text = ""  # completion text so far
        self.num_text_sent = 0  # chars of `text` already handed to the caller
        self.finish_reason: str | None = None
        # With params.structured_output: its matcher, once the grammar is compiled; until
        # then the compile under way, and the scheduler leaves the sequence waiting.
        self.grammar: GrammarMatcher | None = None
        self.grammar_future: Future[CompiledGrammar] | None = None
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_completion_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def last_token_id(self) -> int:
        return self.token_ids[-1]

    @property
    def awaiting_grammar(self) -> bool:
        return self.grammar_future is not None

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def __repr__(self) -> str:
        return f"Sequence({self.request_id!r}, {self.status.name}, {len(self)} tokens)"
