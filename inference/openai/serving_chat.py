"""POST /v1/chat/completions: a conversation, rendered with the model's chat template (and
the request's tools, for a template that shows them), then the shared generation flow."""

from typing import TYPE_CHECKING

from inference.errors import ProtocolError

from .generation import Endpoint
from .protocol import GenerationRequest, parse_chat_request
from .tokenizing import encode_text

if TYPE_CHECKING:
    from inference.engine import LLMEngine


def chat_prompt_ids(
    llm: "LLMEngine", messages: list[dict], tools: list[dict] | None = None
) -> list[int]:
    """The token ids the model is shown: the rendered template, without special tokens
    added on top (the template writes its own). The rendered text is bounded as a prompt is
    (tokenizing.py), with everything the template wrote: tools, tool calls' arguments."""
    text = llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tools=tools)
    return encode_text(
        llm, text, add_special_tokens=False, where="The rendered conversation", param="messages"
    )


def _prompt_ids(llm: "LLMEngine", parsed: GenerationRequest) -> list[list[int]]:
    """A conversation is one prompt."""
    assert parsed.messages is not None, "a chat request has messages"
    tools = parsed.tool_use.template_tools() if parsed.tool_use is not None else None
    return [chat_prompt_ids(llm, parsed.messages, tools)]


def _refuse_tools_the_template_hides(parsed: GenerationRequest, llm: "LLMEngine") -> None:
    if parsed.tool_use is not None and not llm.tokenizer.supports_tools:
        raise ProtocolError(
            "This model's chat template does not support tools: it would not show them "
            'to the model. Send no tools, or tool_choice "none".',
            param="tools",
        )


CHAT = Endpoint(
    kind="chat",
    usage_name="chat.completions",
    parse=parse_chat_request,
    prompt_ids=_prompt_ids,
    check=_refuse_tools_the_template_hides,
)
