"""An operator call's body, read strictly: a field the action does not take is refused,
never ignored."""

from inference.errors import ProtocolError, UnknownParameter
from inference.host.lora_loading import OperatorCall
from inference.openai.protocol import load_json
from platform_site.operator_protocol import (
    LOAD,
    LOAD_FIELDS,
    LOAD_INPLACE,
    LORA_NAME,
    LORA_PATH,
    NAME_FIELDS,
)


def parse_call(raw: bytes, *, action: str) -> OperatorCall:
    body = load_json(raw)
    fields = LOAD_FIELDS if action == LOAD else NAME_FIELDS
    unknown = [name for name in body if name not in fields]
    if unknown:
        names = ", ".join(f"'{name}'" for name in unknown)
        raise UnknownParameter(
            f"Unknown field {names}: {action} takes {', '.join(fields)}.", param=unknown[0]
        )
    path, inplace = body.get(LORA_PATH), body.get(LOAD_INPLACE, False)
    if path is not None and not isinstance(path, str):
        raise ProtocolError(
            f"{LORA_PATH} must be a string: a folder or s3://bucket/prefix/.", param=LORA_PATH
        )
    if not isinstance(inplace, bool):
        raise ProtocolError(f"{LOAD_INPLACE} must be true or false.", param=LOAD_INPLACE)
    if inplace and path is None:
        raise ProtocolError(
            f"{LOAD_INPLACE} applies to a load with {LORA_PATH} (new files for a name).",
            param=LOAD_INPLACE,
        )
    return OperatorCall(body.get(LORA_NAME), path, inplace)
