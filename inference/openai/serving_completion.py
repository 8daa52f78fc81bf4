"""POST /v1/completions: a text prompt or the token ids of one, or a batch of either
(prompts.py), then the shared generation flow."""

from typing import TYPE_CHECKING

from inference.errors import ProtocolError

from .generation import Endpoint
from .protocol import GenerationRequest, parse_completion_request
from .tokenizing import encode_text

if TYPE_CHECKING:
    from inference.engine import LLMEngine


def text_prompt_ids(llm: "LLMEngine", prompt: str | list[int], where: str = "prompt") -> list[int]:
    """A text is encoded as the tokenizer encodes it; token ids pass as given, if the
    vocabulary has them (`where` names the prompt in the refusal)."""
    tokenizer = llm.tokenizer
    if isinstance(prompt, str):
        return encode_text(llm, prompt, where=where, param="prompt")
    bad = [t for t in prompt if t >= tokenizer.vocab_size]
    if bad:
        raise ProtocolError(
            f"{where} holds token id {bad[0]}, outside the vocabulary of {tokenizer.vocab_size}.",
            param="prompt",
        )
    return list(prompt)


def _prompt_ids(llm: "LLMEngine", parsed: GenerationRequest) -> list[list[int]]:
    assert parsed.prompts is not None, "a completion request has a prompt"
    batch = len(parsed.prompts) > 1
    return [
        text_prompt_ids(llm, prompt, f"prompt[{i}]" if batch else "prompt")
        for i, prompt in enumerate(parsed.prompts)
    ]


COMPLETIONS = Endpoint(
    kind="text", usage_name="completions", parse=parse_completion_request, prompt_ids=_prompt_ids
)
