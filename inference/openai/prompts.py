"""The completions API's `prompt` in each shape OpenAI takes: a text, the token ids of one
prompt, or a batch of either (a list of texts, a list of token-id lists).

Evaluation harnesses send batches of token ids, so every shape is one list here: each prompt
of a batch is its own generation of `n` choices. A caller's mistake in any prompt is a 400
naming `prompt` (and in the message, which prompt); token ids past the vocabulary are refused
once the vocabulary is known (serving_completion.py).
"""

from inference.errors import ProtocolError

# One HTTP request fans out into (prompts x choices) engine requests: a batch larger than this
# is refused rather than queued at once.
MAX_PROMPTS = 64

Prompt = str | list[int]

_SHAPES = "a non-empty string, a non-empty list of token ids, or a batch: a list of either"


def parse_prompts(value) -> list[Prompt]:
    """The prompts of `value`, in order; a lone text or token-id list is a batch of one."""
    if isinstance(value, str):
        return [_text(value, "prompt")]
    if not isinstance(value, list) or not value:
        raise ProtocolError(f"prompt must be {_SHAPES}.", param="prompt")
    if all(_is_int(item) for item in value):
        return [_token_ids(value, "prompt")]
    if len(value) > MAX_PROMPTS:
        raise ProtocolError(
            f"prompt holds a batch of {len(value)} prompts; at most {MAX_PROMPTS} per request.",
            param="prompt",
        )
    if all(isinstance(item, str) for item in value):
        return [_text(item, f"prompt[{i}]") for i, item in enumerate(value)]
    if all(isinstance(item, list) for item in value):
        return [_token_ids(item, f"prompt[{i}]") for i, item in enumerate(value)]
    raise ProtocolError(
        f"prompt must be {_SHAPES}; a batch holds only texts or only token-id lists.",
        param="prompt",
    )


def _text(value: str, where: str) -> str:
    if value == "":
        raise ProtocolError(f"{where} must not be empty.", param="prompt")
    return value


def _token_ids(value: list, where: str) -> list[int]:
    if not value:
        raise ProtocolError(f"{where} must not be an empty list of token ids.", param="prompt")
    for token in value:
        if not (_is_int(token) and token >= 0):
            raise ProtocolError(
                f"{where} holds {repr(token)[:40]}; token ids are integers from 0.", param="prompt"
            )
    return value


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
