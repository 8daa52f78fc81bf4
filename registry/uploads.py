"""How adapter files arrive: a multipart upload spilled to disk, or an import from an S3 prefix.

Either way the service receives two local files; neither path ever holds a file whole in
memory, and both stop reading the moment a size limit is passed (413).
"""

from __future__ import annotations

import re
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from botocore.exceptions import BotoCoreError, ClientError
from django.conf import settings
from django.core.files.uploadhandler import TemporaryFileUploadHandler

from inference.engine.lora.peft_rules import CONFIG_FILE, WEIGHTS_FILE

from .errors import (
    InvalidSource,
    SourceNotAllowed,
    SourceNotFound,
    SourceUnreadable,
    StorageUnavailable,
    UnexpectedFile,
    UploadTooLarge,
)
from .objectstore import CHUNK_BYTES, hash_stream, is_missing

CONFIG_FIELD, WEIGHTS_FIELD = "config", "weights"
MAX_CONFIG_BYTES = 1024 * 1024  # an adapter_config.json is a few hundred bytes
MULTIPART_OVERHEAD = 64 * 1024  # boundaries and part headers around the two files


def limits() -> dict[str, int]:
    return {CONFIG_FIELD: MAX_CONFIG_BYTES, WEIGHTS_FIELD: settings.MAX_ADAPTER_BYTES}


def too_large(field: str, limit: int) -> UploadTooLarge:
    file = CONFIG_FILE if field == CONFIG_FIELD else WEIGHTS_FILE
    return UploadTooLarge(
        f"{field} ({file}) is larger than this deployment's limit of {limit} bytes",
        param=field,
    )


class LimitedUploadHandler(TemporaryFileUploadHandler):
    """Spill every file part to a temporary file, counting bytes as they arrive.

    The only handler on the upload endpoint, so nothing is kept in memory; the request is
    refused before reading when Content-Length already says it is too big.
    """

    def handle_raw_input(self, input_data, META, content_length, boundary, encoding=None):
        limit = sum(limits().values()) + MULTIPART_OVERHEAD
        if content_length and content_length > limit:
            raise UploadTooLarge(
                f"the request is {content_length} bytes; this deployment accepts adapters up "
                f"to {settings.MAX_ADAPTER_BYTES} bytes of weights",
            )
        return None

    def new_file(self, field_name, *args, **kwargs):
        if field_name not in limits():
            raise UnexpectedFile(
                f"unexpected file field {field_name!r}; send '{CONFIG_FIELD}' "
                f"({CONFIG_FILE}) and '{WEIGHTS_FIELD}' ({WEIGHTS_FILE})",
                param=field_name,
            )
        super().new_file(field_name, *args, **kwargs)

    def receive_data_chunk(self, raw_data, start):
        limit = limits()[self.field_name]
        if start + len(raw_data) > limit:
            self.file.close()  # a NamedTemporaryFile: closing deletes it
            raise too_large(self.field_name, limit)
        return super().receive_data_chunk(raw_data, start)


# ---------------------------------------------------------------- S3 import

_S3_SOURCE = re.compile(r"s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])/(.*)")


@dataclass(frozen=True)
class S3Source:
    bucket: str
    prefix: str  # "" or ending in "/"

    def key(self, file: str) -> str:
        return self.prefix + file

    def __str__(self):
        return f"s3://{self.bucket}/{self.prefix}"


def parse_s3_source(source: str) -> S3Source:
    """`s3://bucket/prefix/` naming a folder with the two PEFT files; refuses path tricks."""
    match = _S3_SOURCE.fullmatch(source.strip())
    if match is None:
        raise InvalidSource(
            f"source must look like s3://bucket/prefix/, got {source!r}",
            param="source",
        )
    bucket, prefix = match[1], match[2]
    parts = [p for p in prefix.split("/") if p]
    if any(p in (".", "..") for p in parts) or "//" in prefix or "\\" in prefix:
        raise InvalidSource(
            "source prefix must not contain '.', '..' or empty segments",
            param="source",
        )
    if bucket == settings.S3_BUCKET or bucket not in settings.S3_IMPORT_BUCKETS:
        allowed = ", ".join(settings.S3_IMPORT_BUCKETS) or "none (imports are off)"
        raise SourceNotAllowed(
            f"bucket {bucket!r} is not open for imports; allowed buckets: {allowed}",
            param="source",
        )
    return S3Source(bucket, "/".join(parts) + "/" if parts else "")


def _s3_client():
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=settings.S3_IMPORT_ENDPOINT_URL,
        region_name=settings.S3_IMPORT_REGION,
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3}),
    )


def _download(client, source: S3Source, file: str, field: str, dest: Path) -> None:
    key, limit = source.key(file), limits()[field]
    try:
        obj = client.get_object(Bucket=source.bucket, Key=key)
    except (BotoCoreError, ClientError) as exc:
        if is_missing(exc):
            raise SourceNotFound(
                f"{file} not found at s3://{source.bucket}/{key}",
                param="source",
            ) from exc
        if isinstance(exc, ClientError):
            code = exc.response.get("Error", {}).get("Code", "error")
            raise SourceUnreadable(
                f"cannot read s3://{source.bucket}/{key}: {code}",
                param="source",
            ) from exc
        raise StorageUnavailable(
            f"cannot reach the source bucket ({type(exc).__name__}); try again later"
        ) from exc
    body = obj["Body"]
    try:
        if obj.get("ContentLength", 0) > limit:
            raise too_large(field, limit)
        with open(dest, "wb") as out:
            hash_stream(body.iter_chunks(CHUNK_BYTES), out, limit=limit)
    except UploadTooLarge:
        raise too_large(field, limit) from None
    except BotoCoreError as exc:
        raise StorageUnavailable(
            f"reading s3://{source.bucket}/{key} failed ({type(exc).__name__}); try again later"
        ) from exc
    finally:
        body.close()


@contextmanager
def s3_import(source: S3Source):
    """Download the two files into a temporary folder; yields (config file, weights file)."""
    client = _s3_client()
    with tempfile.TemporaryDirectory(prefix="loraplex-import-") as tmp:
        paths = {CONFIG_FIELD: Path(tmp) / CONFIG_FILE, WEIGHTS_FIELD: Path(tmp) / WEIGHTS_FILE}
        _download(client, source, CONFIG_FILE, CONFIG_FIELD, paths[CONFIG_FIELD])
        _download(client, source, WEIGHTS_FILE, WEIGHTS_FIELD, paths[WEIGHTS_FIELD])
        with open(paths[CONFIG_FIELD], "rb") as config, open(paths[WEIGHTS_FIELD], "rb") as weights:
            yield config, weights
