"""`echo` (the completions API): each choice's text starts with its prompt, and with
`logprobs` its legacy logprobs cover the prompt's tokens too. This is how evaluation
harnesses score a text: `echo: true, logprobs: 1` and the prompt tokens' logprobs read back.

A text prompt is echoed as it was sent, token ids as their decoded text. Each prompt token's
`text_offset` is where its text begins: the length of the text its predecessors decode to,
decoded incrementally (a character split over two tokens begins at the first), so for a
tokenizer that gives a text back as encoded the offsets index the echoed text exactly.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .prompts import Prompt

if TYPE_CHECKING:
    from inference.engine.tokenizer import Tokenizer


@dataclass(frozen=True)
class EchoedPrompt:
    text: str  # what each of this prompt's choices' text begins with
    token_ids: list[int]
    offsets: list[int]  # where each prompt token's text begins in `text`


def echoed_prompts(
    tokenizer: "Tokenizer", prompts: Sequence[Prompt], prompt_ids: Sequence[list[int]]
) -> list[EchoedPrompt]:
    """One per prompt of the batch; linear in the prompts' tokens (run off the event loop)."""
    return [
        _echoed(tokenizer, prompt, ids) for prompt, ids in zip(prompts, prompt_ids, strict=True)
    ]


def _echoed(tokenizer: "Tokenizer", prompt: Prompt, ids: list[int]) -> EchoedPrompt:
    detokenizer = tokenizer.detokenizer(skip_special_tokens=True)
    offsets = []
    for token_id in ids:
        offsets.append(len(detokenizer.text))
        detokenizer.push(token_id)
    detokenizer.flush()
    text = prompt if isinstance(prompt, str) else detokenizer.text
    return EchoedPrompt(text, ids, offsets)
