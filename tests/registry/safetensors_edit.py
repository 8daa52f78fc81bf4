"""Take a real safetensors file apart and put it back together wrong, for the refusal tests."""

import json
import struct


def split(data: bytes) -> tuple[dict, bytes]:
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def join(header: dict | bytes, body: bytes) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + body


def tensors_by_offset(header: dict) -> list[str]:
    return sorted(
        (k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"]
    )


def rename(data: bytes, old: str, new: str) -> bytes:
    header, body = split(data)
    header = {k.replace(old, new): v for k, v in header.items()}
    return join(header, body)


def edit_last_tensor(data: bytes, **entry) -> bytes:
    header, body = split(data)
    header[tensors_by_offset(header)[-1]].update(entry)
    return join(header, body)


def shift_last_tensor(data: bytes, by: int) -> bytes:
    header, body = split(data)
    last = header[tensors_by_offset(header)[-1]]
    last["data_offsets"] = [o + by for o in last["data_offsets"]]
    return join(header, body)


def poison_first_float(data: bytes, value: float) -> bytes:
    """Write NaN or Inf over the first element of the first tensor (F32)."""
    header, body = split(data)
    first = header[tensors_by_offset(header)[0]]
    assert first["dtype"] == "F32"
    begin = first["data_offsets"][0]
    body = body[:begin] + struct.pack("<f", value) + body[begin + 4 :]
    return join(header, body)


def garble_header(data: bytes) -> bytes:
    """Keep the length, replace the JSON with bytes that are not JSON."""
    (n,) = struct.unpack("<Q", data[:8])
    return data[:8] + b"{" + b"!" * (n - 1) + data[8 + n :]
