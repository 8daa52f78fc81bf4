"""POST /v1/completions: a text prompt, or the token ids of one, then the shared generation
flow."""

from typing import TYPE_CHECKING

from inference.errors import ProtocolError

from .generation import Endpoint
from .protocol import GenerationRequest, parse_completion_request

if TYPE_CHECKING:
    from inference.engine import LLMEngine


def text_prompt_ids(llm: "LLMEngine", prompt: str | list[int]) -> list[int]:
    """A text is encoded as the tokenizer encodes it; token ids pass as given, if the
    vocabulary has them."""
    tokenizer = llm.tokenizer
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    bad = [t for t in prompt if t >= tokenizer.vocab_size]
    if bad:
        raise ProtocolError(
            f"prompt holds token id {bad[0]}, outside the vocabulary of {tokenizer.vocab_size}.",
            param="prompt",
        )
    return list(prompt)


def _prompt_ids(llm: "LLMEngine", parsed: GenerationRequest) -> list[int]:
    assert parsed.prompt is not None, "a completion request has a prompt"
    return text_prompt_ids(llm, parsed.prompt)


COMPLETIONS = Endpoint(
    kind="text", usage_name="completions", parse=parse_completion_request, prompt_ids=_prompt_ids
)
