"""Checks every request parser shares: a JSON object holds only the fields it may."""

from inference.errors import ProtocolError


def refuse_extra_fields(value: dict, allowed: set[str], where: str) -> None:
    """A field this server does not know is refused by name, never silently ignored."""
    extra = sorted(map(str, set(value) - allowed))
    if extra:
        raise ProtocolError(f"{where} has unsupported field(s): {', '.join(extra)}.", param=where)
