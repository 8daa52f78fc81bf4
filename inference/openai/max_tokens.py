"""How many tokens one choice may generate: what the request asks for, or the deployment's
default when it asks for none, never past the deployment's cap.

Without a default, a chat request that names no `max_tokens` would generate to the end of
the context (thousands of tokens, minutes of an engine's time) whenever the model does not
stop by itself. LORAPLEX_DEFAULT_MAX_TOKENS bounds it (0: the end of the context, as
before); LORAPLEX_MAX_TOKENS_CAP refuses a request that asks for more (0: no cap), as OpenAI
refuses a `max_tokens` past a model's output limit, rather than cut the answer short
unasked. The prompt's room in the context is checked by the caller (generation.py).
"""

from django.conf import settings

from inference.errors import ProtocolError


def max_tokens_for(requested: int | None, param: str, room: int) -> int:
    """`requested`: the request's `max_tokens` (named `param` in it), None when it gave none;
    `room`: what the prompt leaves of the context. A default never exceeds the cap or the room."""
    cap = settings.MAX_TOKENS_CAP
    if requested is None:
        default = settings.DEFAULT_MAX_TOKENS or room
        return min(default, cap or default, room)
    if cap and requested > cap:
        raise ProtocolError(
            f"{param} is {requested}; this server generates at most {cap} tokens per choice "
            "(LORAPLEX_MAX_TOKENS_CAP).",
            param=param,
        )
    return requested
