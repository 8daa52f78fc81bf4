"""How adapter files arrive: a multipart upload spilled to disk, or an import from an S3 prefix.
Eval sets arrive the same way: the upload's optional `eval` part, or the eval-set endpoint's
`file` (EvalSetUploadHandler).

Either way the service receives two local files; neither path ever holds a file whole in
memory, both stop reading the moment a size limit is passed (413), and a disk that fills
up on the way is a clean 507 with the partial files removed. A tenant imports only from
under the prefixes an operator allowed it.
"""

from __future__ import annotations

import errno
import logging
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from botocore.exceptions import BotoCoreError, ClientError
from django.conf import settings
from django.core.files.uploadhandler import TemporaryFileUploadHandler

from inference.engine.lora.peft_rules import CONFIG_FILE, WEIGHTS_FILE
from platform_site.s3_locations import S3Location, parse_s3_location
from tenants.models import Tenant

from .errors import (
    InsufficientStorage,
    InvalidSource,
    SourceNotAllowed,
    SourceNotFound,
    StorageUnavailable,
    UnexpectedFile,
    UploadTooLarge,
)
from .objectstore import CHUNK_BYTES, hash_stream

log = logging.getLogger(__name__)

CONFIG_FIELD, WEIGHTS_FIELD = "config", "weights"
EVAL_FIELD = "eval"  # optional in a version upload: the adapter's eval set, attached with it
EVAL_SET_FIELD = "file"  # the one part of PUT /adapters/{name}/eval-set/
MAX_CONFIG_BYTES = 1024 * 1024  # an adapter_config.json is a few hundred bytes
MULTIPART_OVERHEAD = 64 * 1024  # boundaries and part headers around the files


def limits() -> dict[str, int]:
    """The version upload's file parts and their limits (config and weights; eval optional)."""
    return {
        CONFIG_FIELD: MAX_CONFIG_BYTES,
        WEIGHTS_FIELD: settings.MAX_ADAPTER_BYTES,
        EVAL_FIELD: settings.EVAL_MAX_BYTES,
    }


def eval_set_limits() -> dict[str, int]:
    """The eval-set upload's one file part and its limit."""
    return {EVAL_SET_FIELD: settings.EVAL_MAX_BYTES}


def too_large(field: str, limit: int) -> UploadTooLarge:
    if field in (EVAL_FIELD, EVAL_SET_FIELD):
        what = "the eval set; LORAPLEX_EVAL_MAX_BYTES"
    else:
        what = CONFIG_FILE if field == CONFIG_FIELD else WEIGHTS_FILE
    return UploadTooLarge(
        f"{field} ({what}) is larger than this deployment's limit of {limit} bytes",
        param=field,
    )


_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


@contextmanager
def local_disk(cleanup=None) -> Iterator[None]:
    """Writing to this server's disk: a full disk (or quota) is a 507, after `cleanup()`."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in _DISK_FULL:
            raise
        if cleanup is not None:
            cleanup()
        log.error("local disk full while receiving an adapter: %s", exc)
        raise InsufficientStorage(
            "this server ran out of disk space while receiving the files; nothing was kept, "
            "try again later"
        ) from exc


class LimitedUploadHandler(TemporaryFileUploadHandler):
    """Spill every file part to a temporary file, counting bytes as they arrive.

    The only handler on the upload endpoint, so nothing is kept in memory; the request is
    refused before reading when Content-Length already says it is too big. A full disk
    closes (so deletes) the part being written; Django's parser closes the finished ones.
    """

    def field_limits(self) -> dict[str, int]:
        """The file parts this endpoint takes, and the bytes each may hold."""
        return limits()

    def request_too_large(self, content_length: int) -> UploadTooLarge:
        return UploadTooLarge(
            f"the request is {content_length} bytes; this deployment accepts adapters up "
            f"to {settings.MAX_ADAPTER_BYTES} bytes of weights",
        )

    def unexpected_file(self, field_name: str) -> UnexpectedFile:
        return UnexpectedFile(
            f"unexpected file field {field_name!r}; send '{CONFIG_FIELD}' ({CONFIG_FILE}) and "
            f"'{WEIGHTS_FIELD}' ({WEIGHTS_FILE}), and optionally '{EVAL_FIELD}' (an eval set, "
            "JSONL)",
            param=field_name,
        )

    def handle_raw_input(self, input_data, META, content_length, boundary, encoding=None):
        limit = sum(self.field_limits().values()) + MULTIPART_OVERHEAD
        if content_length and content_length > limit:
            raise self.request_too_large(content_length)
        return None

    def new_file(self, field_name, *args, **kwargs):
        if field_name not in self.field_limits():
            raise self.unexpected_file(field_name)
        with local_disk():
            super().new_file(field_name, *args, **kwargs)

    def receive_data_chunk(self, raw_data, start):
        limit = self.field_limits()[self.field_name]
        if start + len(raw_data) > limit:
            self.file.close()  # a NamedTemporaryFile: closing deletes it
            raise too_large(self.field_name, limit)
        with local_disk(cleanup=self._discard):
            return super().receive_data_chunk(raw_data, start)

    def file_complete(self, file_size):
        with local_disk(cleanup=self._discard):  # buffered bytes reach the disk here
            return super().file_complete(file_size)

    def _discard(self):
        with suppress(OSError):  # flushing the buffer fails again; the file is unlinked anyway
            self.file.close()


class EvalSetUploadHandler(LimitedUploadHandler):
    """The same, for PUT /adapters/{name}/eval-set/: one part, `file`, the eval set."""

    def field_limits(self) -> dict[str, int]:
        return eval_set_limits()

    def request_too_large(self, content_length: int) -> UploadTooLarge:
        return UploadTooLarge(
            f"the request is {content_length} bytes; this deployment accepts eval sets up to "
            f"{settings.EVAL_MAX_BYTES} bytes (LORAPLEX_EVAL_MAX_BYTES)",
            param=EVAL_SET_FIELD,
        )

    def unexpected_file(self, field_name: str) -> UnexpectedFile:
        return UnexpectedFile(
            f"unexpected file field {field_name!r}; send the eval set (JSONL) as "
            f"'{EVAL_SET_FIELD}'",
            param=field_name,
        )


# ---------------------------------------------------------------- S3 import


def parse_s3_source(source: str, *, tenant: Tenant) -> S3Location:
    """`s3://bucket/prefix/` holding the two PEFT files, under one of the tenant's prefixes.

    Two fences: the operator-wide LORAPLEX_S3_IMPORT_BUCKETS (the buckets this deployment's
    import credentials may be pointed at at all; never its own bucket) and, inside them, the
    prefixes an operator allowed this tenant in the admin.
    """
    try:
        location = parse_s3_location(source)
    except ValueError as exc:
        raise InvalidSource(f"source {exc}", param="source") from None
    allowed = tenant.import_prefixes
    if not any(prefix.contains(location) for prefix in allowed):
        listed = ", ".join(map(str, allowed)) or "none are set; an operator sets them in the admin"
        raise SourceNotAllowed(
            f"{location} is not under an import prefix of this tenant ({listed})",
            param="source",
        )
    check_import_bucket(location)
    return location


def check_import_bucket(location: S3Location) -> None:
    """Imports (a tenant's, an operator's `lora_path`) read only buckets an operator opened,
    never the deployment's own: it holds every tenant's stored versions."""
    if location.bucket == settings.S3_BUCKET or location.bucket not in settings.S3_IMPORT_BUCKETS:
        raise SourceNotAllowed(
            f"bucket {location.bucket!r} is not open for imports on this deployment "
            "(LORAPLEX_S3_IMPORT_BUCKETS)",
            param="source",
        )


def _s3_client():
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=settings.S3_IMPORT_ENDPOINT_URL,
        region_name=settings.S3_IMPORT_REGION,
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3}),
    )


def _refused_by_source(exc: ClientError) -> bool:
    """Not a 5xx: the object is missing, or this deployment may not read it (permissions,
    an archived object, another region); only a failing server is worth retrying."""
    return exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) < 500


def _download(client, source: S3Location, file: str, field: str, dest: Path) -> None:
    key, limit = source.key(file), limits()[field]
    try:
        obj = client.get_object(Bucket=source.bucket, Key=key)
    except (BotoCoreError, ClientError) as exc:
        if isinstance(exc, ClientError) and _refused_by_source(exc):
            # Missing and forbidden are one answer: an import must not probe what exists.
            log.info("import of s3://%s/%s refused: %s", source.bucket, key, exc)
            raise SourceNotFound(
                f"{file} not found at s3://{source.bucket}/{key}, or not readable by this "
                "deployment",
                param="source",
            ) from exc
        log.warning("import of s3://%s/%s failed: %s", source.bucket, key, exc)
        raise StorageUnavailable(  # the file named wherever the connection broke
            f"fetching s3://{source.bucket}/{key} failed: cannot reach the source bucket "
            f"({type(exc).__name__}); try again later"
        ) from exc
    body = obj["Body"]
    try:
        if obj.get("ContentLength", 0) > limit:
            raise too_large(field, limit)
        with local_disk(cleanup=lambda: dest.unlink(missing_ok=True)), open(dest, "wb") as out:
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
def s3_import(source: S3Location):
    """Download the two files into a temporary folder; yields (config file, weights file)."""
    client = _s3_client()
    with local_disk(), tempfile.TemporaryDirectory(prefix="loraplex-import-") as tmp:
        paths = {CONFIG_FIELD: Path(tmp) / CONFIG_FILE, WEIGHTS_FIELD: Path(tmp) / WEIGHTS_FILE}
        _download(client, source, CONFIG_FILE, CONFIG_FIELD, paths[CONFIG_FIELD])
        _download(client, source, WEIGHTS_FILE, WEIGHTS_FIELD, paths[WEIGHTS_FIELD])
        with open(paths[CONFIG_FIELD], "rb") as config, open(paths[WEIGHTS_FIELD], "rb") as weights:
            yield config, weights
