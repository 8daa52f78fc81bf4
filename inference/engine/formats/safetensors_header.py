"""Read a safetensors header without trusting it and without torch.

The registry validates uploads before anything loads them, so this parser must
survive arbitrary bytes: it returns a `SafetensorsHeader` or raises
`HeaderError`, never anything else, in time linear in the header's size. Every
number is bounded before any arithmetic (JSON integers by their digit count,
before Python converts them), and messages quote the file's values briefly.
It is as strict as the reference Rust loader (tensors must tile the data
buffer exactly) and stricter on sizes, so whatever passes here also opens
with `safetensors`.
"""

from __future__ import annotations

import io
import math
import os
import reprlib
import struct
from dataclasses import dataclass
from typing import Any, BinaryIO, NoReturn

from .untrusted_json import load_object

MAX_HEADER_BYTES = 16 * 1024 * 1024
# Far above any real checkpoint, far below what costs time: a tensor has at most
# MAX_DIMS dimensions, each below MAX_DIM; a file names at most MAX_TENSORS tensors.
MAX_DIMS = 8
MAX_DIM = 2**40
MAX_TENSORS = 1 << 17
MAX_NAME_CHARS = 1024
# Offsets are u64 in the format: 2**64 - 1 has 20 digits. Python converts a digit
# string in time quadratic in its length, so longer ones are refused unconverted.
_MAX_INT_DIGITS = 20
_MAX_FLOAT_CHARS = 40

# Bytes per element. F8 names are accepted so such files parse; nothing here
# computes with them.
DTYPE_SIZES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
}

# Non-finite test per float dtype: (little-endian unsigned view, mask, pattern).
# An all-ones exponent is Inf or NaN, so the bits answer without converting.
_NONFINITE_BITS = {
    "F64": ("<u8", 0x7FF0_0000_0000_0000, 0x7FF0_0000_0000_0000),
    "F32": ("<u4", 0x7F80_0000, 0x7F80_0000),
    "F16": ("<u2", 0x7C00, 0x7C00),
    "BF16": ("<u2", 0x7F80, 0x7F80),
    "F8_E5M2": ("<u1", 0x7C, 0x7C),
    "F8_E4M3": ("<u1", 0x7F, 0x7F),  # the "fn" variant: no Inf, NaN is S.1111.111
    "F8_E8M0": ("<u1", 0xFF, 0xFF),
}

_CHUNK_BYTES = 4 * 1024 * 1024
_PICKLE_OR_ZIP = (b"\x80", b"PK")


class HeaderError(ValueError):
    """The file is not a safetensors file this platform accepts."""


_brief = reprlib.Repr()  # keyword arguments only from Python 3.12
_brief.maxlevel, _brief.maxlist, _brief.maxdict = 2, 4, 4
_brief.maxstring = _brief.maxother = 60


def show(value: object) -> str:
    """A short repr of a value from the file, whatever its size, for messages."""
    return _brief.repr(value)


@dataclass(frozen=True)
class TensorInfo:
    dtype: str
    shape: tuple[int, ...]
    begin: int  # offsets relative to the data buffer, as in the file
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class SafetensorsHeader:
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]
    data_start: int  # absolute file offset of the data buffer (8 + header length)


def parse_header(
    source: str | os.PathLike[str] | BinaryIO | bytes,
    *,
    file_size: int | None = None,
    max_header_bytes: int = MAX_HEADER_BYTES,
) -> SafetensorsHeader:
    """Parse and validate the header of a path, open binary file, or bytes."""
    if isinstance(source, bytes | bytearray | memoryview):
        return _parse(io.BytesIO(bytes(source)), file_size, max_header_bytes)
    if isinstance(source, str | os.PathLike):
        try:
            with open(source, "rb") as f:
                return _parse(f, file_size, max_header_bytes)
        except OSError as e:
            raise HeaderError(f"cannot read {os.fspath(source)!r}: {e.strerror or e}") from e
    return _parse(source, file_size, max_header_bytes)


def _parse(f: BinaryIO, file_size: int | None, max_header_bytes: int) -> SafetensorsHeader:
    if file_size is None:
        file_size = _size_of(f)
    head = _read(f, min(file_size, 8))
    if len(head) < 8:
        raise HeaderError(
            f"file is {file_size} bytes; a safetensors file starts with an 8-byte header length"
        )
    (n,) = struct.unpack("<Q", head)
    if n > max_header_bytes or 8 + n > file_size:
        after = _read(f, min(64, file_size - 8))
        _refuse_pickle(head, after)
        _refuse_non_safetensors(after)
        if n > max_header_bytes:
            raise HeaderError(f"header length {n} is above the limit of {max_header_bytes} bytes")
        raise HeaderError(f"header length {n} runs past the end of the {file_size}-byte file")
    raw = _read(f, n)
    if len(raw) < n:
        raise HeaderError(f"file ends inside the {n}-byte header")
    _refuse_pickle(head, raw)
    doc = _decode_json(raw)
    data_size = file_size - 8 - n
    metadata = _metadata(doc.pop("__metadata__", None))
    if len(doc) > MAX_TENSORS:
        raise HeaderError(f"header lists {len(doc)} tensors; at most {MAX_TENSORS}")
    tensors = {name: _tensor(name, entry, data_size) for name, entry in doc.items()}
    _check_tiling(tensors, data_size)
    return SafetensorsHeader(tensors=tensors, metadata=metadata, data_start=8 + n)


def _refuse_pickle(head: bytes, after: bytes) -> None:
    """A torch .bin/.pt starts with a pickle opcode or a zip signature, not a JSON object."""
    if head.startswith(_PICKLE_OR_ZIP) and not after.lstrip().startswith(b"{"):
        raise HeaderError(
            "this looks like a PyTorch pickle or zip file (.bin/.pt); only safetensors is "
            "accepted: save with safe_serialization=True or convert with safetensors.torch"
        )


def _refuse_non_safetensors(after: bytes) -> None:
    """A header length that does not fit, and no JSON object after it: some other file, whose
    first 8 bytes read as a length mean nothing, so say what it is not."""
    if after and not after.lstrip().startswith(b"{"):
        raise HeaderError(
            "not a safetensors file: a safetensors file starts with an 8-byte header length "
            f"and a JSON object, and this one has the bytes {after[:8].hex(' ')} there"
        )


def _size_of(f: BinaryIO) -> int:
    try:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(0)
    except (OSError, AttributeError, ValueError) as e:
        raise HeaderError("cannot tell the file size of this stream; pass file_size") from e
    return size


def _read(f: BinaryIO, n: int) -> bytes:
    chunks, left = [], n
    while left > 0:
        chunk = f.read(left)
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _decode_json(raw: bytes) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise HeaderError(f"header is not valid UTF-8 (byte {e.start})") from e
    return load_object(
        text,
        "header",
        HeaderError,
        object_pairs_hook=_no_duplicates,
        parse_constant=_no_constant,
        parse_int=_bounded_int,
        parse_float=_bounded_float,
    )


def _bounded_int(digits: str) -> int:
    """json's parse_int hook: sees the digit string before anything converts it."""
    n = len(digits) - digits.startswith("-")
    if n > _MAX_INT_DIGITS:
        raise HeaderError(
            f"header holds a {n}-digit number; every number in a safetensors header is "
            "below 2**64 (20 digits)"
        )
    return int(digits)


def _bounded_float(text: str) -> float:
    """No header field is a float, but a short one gets the precise message further on."""
    if len(text) > _MAX_FLOAT_CHARS:
        raise HeaderError(
            f"header holds a number of {len(text)} characters; not a safetensors value"
        )
    return float(text)


def _no_constant(name: str) -> NoReturn:
    """Python's json takes NaN/Infinity; JSON (and the Rust safetensors loader) does not."""
    raise HeaderError(f"header is not valid JSON: {name} is not a JSON value")


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise HeaderError(f"header names {show(key)} twice")
        out[key] = value
    return out


def _metadata(meta: object) -> dict[str, str]:
    if meta is None:
        return {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise HeaderError("__metadata__ must be an object mapping strings to strings")
    return meta


def _tensor(name: str, entry: object, data_size: int) -> TensorInfo:
    if len(name) > MAX_NAME_CHARS:
        raise HeaderError(
            f"tensor name {show(name)} has {len(name)} characters; at most {MAX_NAME_CHARS}"
        )
    if not isinstance(entry, dict):
        raise HeaderError(
            f"tensor {show(name)}: entry must be an object, not {type(entry).__name__}"
        )
    missing = [k for k in ("dtype", "shape", "data_offsets") if k not in entry]
    if missing:
        raise HeaderError(f"tensor {show(name)}: missing {', '.join(missing)}")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
        raise HeaderError(
            f"tensor {show(name)}: unknown dtype {show(dtype)}; allowed: {', '.join(DTYPE_SIZES)}"
        )
    _check_shape(name, shape)
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_uint, offsets))):
        raise HeaderError(f"tensor {show(name)}: data_offsets must be two non-negative integers")
    begin, end = offsets
    if begin > end:
        raise HeaderError(f"tensor {show(name)}: data_offsets begin {begin} is after end {end}")
    if end > data_size:
        raise HeaderError(
            f"tensor {show(name)}: data_offsets end {end} is outside the {data_size}-byte "
            "data buffer"
        )
    # Bounded operands: at most 8 factors below 2**40, and end - begin below the file size.
    expected = math.prod(shape) * DTYPE_SIZES[dtype]
    if end - begin != expected:
        raise HeaderError(
            f"tensor {show(name)}: {end - begin} bytes stored but shape {shape} of {dtype} "
            f"needs {expected}"
        )
    return TensorInfo(dtype=dtype, shape=tuple(shape), begin=begin, end=end)


def _check_shape(name: str, shape: object) -> None:
    if not isinstance(shape, list):
        raise HeaderError(f"tensor {show(name)}: shape must be a list of non-negative integers")
    if len(shape) > MAX_DIMS:
        raise HeaderError(
            f"tensor {show(name)}: shape has {len(shape)} dimensions; at most {MAX_DIMS}"
        )
    if not all(_is_uint(d) for d in shape):
        raise HeaderError(f"tensor {show(name)}: shape must be a list of non-negative integers")
    if any(d >= MAX_DIM for d in shape):
        raise HeaderError(
            f"tensor {show(name)}: shape {shape} has a dimension not below 2**40; "
            "no real tensor is that large"
        )


def _is_uint(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _check_tiling(tensors: dict[str, TensorInfo], data_size: int) -> None:
    """Tensors must cover the data buffer exactly, in some order, like the reference loader."""
    pos, prev = 0, None
    for name, t in sorted(tensors.items(), key=lambda kv: (kv[1].begin, kv[1].end)):
        if t.begin < pos:
            raise HeaderError(f"tensors {show(prev)} and {show(name)} overlap in the data buffer")
        if t.begin > pos:
            raise HeaderError(f"{t.begin - pos} unused bytes before tensor {show(name)}")
        pos, prev = t.end, name
    if pos != data_size:
        raise HeaderError(f"{data_size - pos} bytes after the last tensor belong to no tensor")


def check_finite(path: str | os.PathLike[str], header: SafetensorsHeader) -> list[str]:
    """Names of float tensors holding NaN or Inf, read in bounded chunks."""
    bad = []
    with open(path, "rb") as f:
        for name, t in header.tensors.items():
            rule = _NONFINITE_BITS.get(t.dtype)
            if rule is not None and _has_nonfinite(f, header.data_start + t.begin, t.nbytes, rule):
                bad.append(name)
    return bad


def _has_nonfinite(f: BinaryIO, start: int, nbytes: int, rule: tuple[str, int, int]) -> bool:
    import numpy as np  # lazily: the engine box may lack numpy and checks with torch instead

    view, mask, pattern = rule
    itemsize = np.dtype(view).itemsize
    step = _CHUNK_BYTES - _CHUNK_BYTES % itemsize
    f.seek(start)
    done = 0
    while done < nbytes:
        want = min(step, nbytes - done)
        chunk = _read(f, want)
        if len(chunk) < want:
            raise HeaderError("file is shorter than its header says; was it truncated?")
        bits = np.frombuffer(chunk, dtype=view)
        if np.any((bits & mask) == pattern):
            return True
        done += want
    return False
