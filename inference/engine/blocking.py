"""Running prompts to completion on an otherwise idle engine (tests, benchmarks, a score with
no serving loop): the caller's thread steps the engine until every prompt has finished."""

from collections.abc import Sequence as SequenceOf
from typing import Protocol

from .errors import InvalidRequestError
from .outputs import CompletionOutput, RequestOutput
from .request import EngineRequest, LoRARequest
from .sampling_params import SamplingParams
from .scoring import ScoreResult, score_request, score_result
from .sequence import Sequence


class SteppedEngine(Protocol):
    """What of LLMEngine a blocking run uses."""

    @property
    def requests(self) -> dict[str, Sequence]: ...

    @property
    def num_steps(self) -> int: ...

    def make_sequence(self, request: EngineRequest) -> Sequence: ...

    def add_sequence(self, seq: Sequence) -> None: ...

    def step(self) -> list[RequestOutput]: ...

    def wait_for_load(self, timeout: float) -> bool: ...


def generate(
    engine: SteppedEngine,
    prompts: SequenceOf[str | list[int]],
    sampling_params: SamplingParams | list[SamplingParams] | None,
    lora_request: LoRARequest | list[LoRARequest | None] | None,
) -> list[CompletionOutput]:
    """Every prompt's whole output, in prompt order (see LLMEngine.generate)."""
    if engine.requests:
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
        engine.make_sequence(
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
        engine.add_sequence(seq)
    while any(r.finish_reason is None for r in results.values()):
        steps = engine.num_steps
        outputs = engine.step()
        if not outputs and engine.num_steps == steps:  # only adapter loads are in progress
            engine.wait_for_load(0.05)
        for out in outputs:
            result = results.get(out.request_id)
            if result is not None:
                _merge(result, out)
    return list(results.values())


def score(
    engine: SteppedEngine,
    prompt_token_ids: list[int],
    completion_token_ids: list[int],
    lora_request: LoRARequest | None,
) -> ScoreResult:
    """log P(completion | prompt) (see LLMEngine.score)."""
    request = score_request(
        f"score-{id(prompt_token_ids)}", prompt_token_ids, completion_token_ids, lora_request
    )
    assert request.prompt_token_ids is not None
    [out] = generate(
        engine, [request.prompt_token_ids], request.sampling_params, request.lora_request
    )
    if out.error is not None:
        raise out.error
    return score_result(out.prompt_logprobs, len(prompt_token_ids))


def _merge(result: CompletionOutput, out: RequestOutput) -> None:
    """Add one step's delta to a prompt's whole output."""
    result.token_ids += out.new_token_ids
    result.text += out.new_text
    result.logprobs += out.new_logprobs
    if out.prompt_logprobs is not None:
        result.prompt_logprobs = out.prompt_logprobs
    result.finish_reason = out.finish_reason
    result.error = out.error
