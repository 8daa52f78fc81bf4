"""POST /tokenize and /detokenize, as vLLM serves them: a prompt or a conversation -> the token
ids the model is shown, and token ids -> text. Clients count a prompt against the context
(`max_model_len` comes with the ids) before sending it, or check how a text splits.

The tokenizer is the one of the base model `model` runs on, so `model` is resolved within
the caller's tenant as for generation: another tenant's model is as unknown as a missing
one, and a model of another base (another tokenizer) belongs to that base's replicas. A
missing `model` means this replica's base model, as in vLLM. Adapters never change the
tokenizer, so which version a name resolves to does not matter here.

Both are bounded as prompts are (tokenizing.py): a text over the characters a prompt may hold
is refused before tokenizing, and neither answers more than `max_model_len` tokens (no
prompt holds more), which also keeps the answer's size in proportion to the context.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING

from inference.engine.tokenizer import TokenizerError
from inference.errors import ContextLengthExceeded, ProtocolError, UnknownParameter

from .protocol import parse_chat_messages
from .tokenizing import encode_text, messages_chars, refuse_long_text

if TYPE_CHECKING:
    from inference.engine import LLMEngine

TOKENIZE_FIELDS = {
    "model",
    "prompt",
    "messages",
    "add_special_tokens",
    "add_generation_prompt",
    "return_token_strs",
}
DETOKENIZE_FIELDS = {"model", "tokens"}


@dataclass(frozen=True)
class TokenizeRequest:
    model: str | None
    prompt: str | None = None  # exactly one of prompt and messages
    messages: list[dict] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    return_token_strs: bool = False


@dataclass(frozen=True)
class DetokenizeRequest:
    model: str | None
    tokens: list[int]


def parse_tokenize_request(body: dict) -> TokenizeRequest:
    _refuse_unknown(body, TOKENIZE_FIELDS)
    model = _model(body)
    has_prompt, has_messages = body.get("prompt") is not None, body.get("messages") is not None
    if has_prompt == has_messages:
        raise ProtocolError(
            "Give exactly one of prompt (a string) and messages (a conversation).", param="prompt"
        )
    return_token_strs = _flag(body, "return_token_strs", False)
    if has_messages:
        return TokenizeRequest(
            model=model,
            messages=parse_chat_messages(body["messages"], with_tools=True),
            # the chat template writes its own special tokens: none added on top, as in chat
            add_special_tokens=_flag(body, "add_special_tokens", False),
            add_generation_prompt=_flag(body, "add_generation_prompt", True),
            return_token_strs=return_token_strs,
        )
    if "add_generation_prompt" in body:
        raise ProtocolError(
            "add_generation_prompt applies to messages, not to a prompt.",
            param="add_generation_prompt",
        )
    prompt = body["prompt"]
    if not isinstance(prompt, str):
        raise ProtocolError("prompt must be a string.", param="prompt")
    return TokenizeRequest(
        model=model,
        prompt=prompt,
        add_special_tokens=_flag(body, "add_special_tokens", True),
        return_token_strs=return_token_strs,
    )


def parse_detokenize_request(body: dict) -> DetokenizeRequest:
    _refuse_unknown(body, DETOKENIZE_FIELDS)
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(_is_id(t) for t in tokens):
        raise ProtocolError("tokens must be a list of token ids (integers).", param="tokens")
    return DetokenizeRequest(model=_model(body), tokens=tokens)


def tokenize(llm: "LLMEngine", request: TokenizeRequest) -> dict:
    """The ids as generation would see them: a prompt encoded as completions encode it, a
    conversation rendered with the chat template as chat renders it (by default)."""
    tokenizer = llm.tokenizer
    if request.messages is not None:
        where, param = "The rendered conversation", "messages"
        refuse_long_text(
            llm, messages_chars(request.messages), where="The conversation", param=param
        )
        try:
            text = tokenizer.apply_chat_template(
                request.messages, add_generation_prompt=request.add_generation_prompt
            )
        except TokenizerError as exc:  # no template, or the template refused the messages
            raise ProtocolError(f"{str(exc).capitalize()}.", param="messages") from None
    else:
        assert request.prompt is not None, "parsed: a prompt or messages"
        where, param, text = "The prompt", "prompt", request.prompt
    ids = encode_text(
        llm, text, add_special_tokens=request.add_special_tokens, where=where, param=param
    )
    if len(ids) > llm.max_seq_len:
        raise ContextLengthExceeded(
            f"{where} is {len(ids)} tokens; /tokenize answers at most this model's context, "
            f"max_model_len {llm.max_seq_len}.",
            param=param,
        )
    return {
        "count": len(ids),
        "max_model_len": llm.max_seq_len,
        "tokens": ids,
        "token_strs": tokenizer.token_strings(ids) if request.return_token_strs else None,
    }


def detokenize(llm: "LLMEngine", request: DetokenizeRequest) -> dict:
    """The text of the ids as given, special tokens included (a round trip of /tokenize)."""
    if len(request.tokens) > llm.max_seq_len:
        raise ProtocolError(
            f"tokens holds {len(request.tokens)} ids; /detokenize takes at most this model's "
            f"context, max_model_len {llm.max_seq_len}.",
            param="tokens",
        )
    vocab = llm.tokenizer.vocab_size
    outside = next((t for t in request.tokens if t >= vocab), None)
    if outside is not None:
        raise ProtocolError(
            f"tokens holds token id {outside}, outside the vocabulary of {vocab}.",
            param="tokens",
        )
    return {"prompt": llm.tokenizer.decode(request.tokens, skip_special_tokens=False)}


def _refuse_unknown(body: dict, allowed: set[str]) -> None:
    """A field this endpoint does not take is refused by name, never silently ignored."""
    unknown = sorted(map(str, set(body) - allowed))
    if unknown:
        raise UnknownParameter(f"Unknown parameter '{unknown[0]}'.", param=unknown[0])


def _model(body: dict) -> str | None:
    model = body.get("model")
    if model is not None and not (isinstance(model, str) and model.strip()):
        raise ProtocolError("model must be a model name string.", param="model")
    return model


def _flag(body: dict, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ProtocolError(f"{name} must be a boolean.", param=name)
    return value


def _is_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
