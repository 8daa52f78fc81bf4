"""Request bodies parsed in this process (inference/openai/protocol.py), without a server:
model "m", a one-line question or prompt unless the test gives its own."""

from inference.openai.protocol import parse_chat_request, parse_completion_request

USER = [{"role": "user", "content": "Hi"}]


def parsed_chat(*, messages=USER, **body):
    """The chat request `body` (and `messages`) make, or the ProtocolError refusing it."""
    return parse_chat_request({"model": "m", "messages": messages, **body})


def parsed_completion(*, prompt="Hi", **body):
    """The completion request `body` (and `prompt`) make, or the ProtocolError refusing it."""
    return parse_completion_request({"model": "m", "prompt": prompt, **body})
