"""The registry's view of object storage: Django's default storage (a local folder or S3).

Everything here moves bytes in bounded chunks and sorts storage failures into two kinds:
`ObjectMissing` (retrying will not help) and `StorageUnavailable` (retry with backoff).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from botocore.exceptions import BotoCoreError, ClientError
from django.core.files import File
from django.core.files.storage import storages

from .errors import ObjectMissing, StorageUnavailable, UploadTooLarge

log = logging.getLogger(__name__)
CHUNK_BYTES = 1024 * 1024
_MISSING_CODES = {"404", "NoSuchKey", "NotFound", "NoSuchBucket"}


@dataclass(frozen=True)
class Digest:
    sha256: str
    size: int


def storage():
    """Looked up on every call: tests and settings changes swap the backend."""
    return storages["default"]


def is_missing(exc: BaseException) -> bool:
    if isinstance(exc, FileNotFoundError):
        return True
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code")) in _MISSING_CODES
    return False


@contextmanager
def storage_errors(action: str, key: str):
    """Translate backend exceptions into the registry's two kinds of storage failure."""
    try:
        yield
    except (OSError, BotoCoreError, ClientError) as exc:
        # Tenants read these messages: name the file and the kind of failure, and leave
        # endpoints, buckets and credentials to the log.
        file = key.rsplit("/", 1)[-1]
        if is_missing(exc):
            log.error("object %s is missing: %s", key, exc)
            raise ObjectMissing(f"stored {file} is missing from object storage") from exc
        log.warning("object storage failed to %s %s: %s", action, key, exc)
        raise StorageUnavailable(
            f"object storage failed to {action} {file} ({type(exc).__name__})"
        ) from exc


def hash_stream(chunks: Iterable[bytes], out: BinaryIO | None = None, *, limit: int) -> Digest:
    """Hash (and optionally copy) a stream of chunks; UploadTooLarge once it passes `limit`."""
    sha, size = hashlib.sha256(), 0
    for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise UploadTooLarge(f"more than {limit} bytes")
        sha.update(chunk)
        if out is not None:
            out.write(chunk)
    return Digest(sha.hexdigest(), size)


def file_chunks(f: BinaryIO, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    f.seek(0)
    while chunk := f.read(chunk_bytes):
        yield chunk


def save(key: str, f: BinaryIO) -> str:
    """Write a local file object under a fresh `key`; returns the name storage chose (`key`).

    A write that fails half-way (a full disk) leaves nothing: the local backend would keep
    the partial file, so `key`, never used before, is deleted again.
    """
    f.seek(0)
    try:
        with storage_errors("write", key):
            return storage().save(key, File(f, name=key.rsplit("/", 1)[-1]))
    except StorageUnavailable:
        delete_quietly([key])
        raise


def _s3_chunks(backend, key: str) -> Iterator[bytes]:
    body = backend.bucket.Object(backend._normalize_name(key)).get()["Body"]
    try:
        yield from body.iter_chunks(CHUNK_BYTES)
    finally:
        body.close()


def _file_chunks(backend, key: str) -> Iterator[bytes]:
    with backend.open(key, "rb") as f:
        yield from f.chunks(CHUNK_BYTES)


def fetch(key: str, dest: Path, *, limit: int) -> Digest:
    """Stream an object into a local file, hashing as it goes; never holds it whole in memory.

    S3 is read straight from the response body: django-storages' S3File would first buffer
    the whole object in memory (its spool size defaults to 0, meaning "never roll over").
    """
    backend = storage()
    chunks = _s3_chunks(backend, key) if hasattr(backend, "bucket") else _file_chunks(backend, key)
    with storage_errors("read", key), open(dest, "wb") as out:
        return hash_stream(chunks, out, limit=limit)


def delete_quietly(keys: Iterable[str]) -> list[str]:
    """Delete objects, logging (not raising) failures; returns the keys that could not go."""
    failed = []
    for key in keys:
        if not key:
            continue
        try:
            with storage_errors("delete", key):
                storage().delete(key)
        except ObjectMissing:
            pass
        except StorageUnavailable as exc:
            log.error("could not delete %s: %s", key, exc)
            failed.append(key)
    return failed
