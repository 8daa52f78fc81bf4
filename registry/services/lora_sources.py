"""Where an operator's adapter files come from: vLLM's `lora_path`, a local folder or an
`s3://bucket/prefix/`, opened as the two local files the upload path takes.

The operator token travels over the network, so what it may make this server read is fenced:

- a local folder (and each of its two files, symlinks resolved) must lie under one of
  LORAPLEX_LORA_PATH_ROOTS, none by default; LORAPLEX_LORA_MODULES, written by whoever starts
  the process, is not held to them (`roots=None`). Never inside the adapter cache or the
  local object store, whatever the roots: they hold every tenant's files;
- an S3 prefix must be in a bucket open for imports (LORAPLEX_S3_IMPORT_BUCKETS, never the
  deployment's own), as a tenant's import; an operator is not held to a tenant's prefixes.

A path outside the roots is refused before it is looked at, so the answer does not say
whether it exists. Errors name the field `source`, as an import's do.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from django.conf import settings
from django.core.files.storage import FileSystemStorage

from inference.engine.lora.peft_rules import CONFIG_FILE, WEIGHTS_FILE
from platform_site.s3_locations import S3Location, parse_s3_location

from ..errors import InvalidSource, SourceNotAllowed, SourceNotFound
from ..objectstore import storage
from ..uploads import check_import_bucket, s3_import

PARAM = "source"
MAX_SOURCE_CHARS = 1024  # as an import's `source`
SHAPE = "an absolute folder path or s3://bucket/prefix/"


@dataclass(frozen=True)
class LocalFolder:
    path: Path  # resolved: no symlink, no `..`
    roots: tuple[Path, ...] | None  # the fence its files are held to; None: any folder

    def __str__(self) -> str:
        return str(self.path)


LoraSource = LocalFolder | S3Location


def configured_roots() -> tuple[Path, ...]:
    """LORAPLEX_LORA_PATH_ROOTS as written and resolved (a root may itself be a symlink)."""
    roots = [Path(os.path.normpath(root)) for root in settings.LORA_PATH_ROOTS]
    return tuple(dict.fromkeys([*roots, *(root.resolve() for root in roots)]))


def parse_lora_source(text: object, *, roots: Sequence[Path] | None) -> LoraSource:
    """The folder or S3 prefix `text` names, if this deployment may read it."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidSource(f"{PARAM} must be {SHAPE}", param=PARAM)
    if len(text) > MAX_SOURCE_CHARS or "\x00" in text:
        raise InvalidSource(
            f"{PARAM} must be {SHAPE} of at most {MAX_SOURCE_CHARS} characters", param=PARAM
        )
    if text.startswith("s3://"):
        try:
            location = parse_s3_location(text)
        except ValueError as exc:
            raise InvalidSource(f"{PARAM} {exc}", param=PARAM) from None
        check_import_bucket(location)
        return location
    if "://" in text:
        raise InvalidSource(f"{PARAM} must be {SHAPE}; no other scheme is read", param=PARAM)
    if not os.path.isabs(text):
        raise InvalidSource(f"{PARAM} must be {SHAPE}, not the relative {text!r}", param=PARAM)
    fence = None if roots is None else tuple(roots)
    folder = _readable(Path(os.path.normpath(text)), fence, what=text)
    if not folder.is_dir():
        raise InvalidSource(
            f"{text} is not a folder; name the folder holding {CONFIG_FILE}", param=PARAM
        )
    return LocalFolder(folder, fence)


def _readable(path: Path, roots: tuple[Path, ...] | None, *, what: str) -> Path:
    """`path` resolved, once it is known to lie inside the fence (before and after symlinks)."""
    if roots is not None:
        _inside(path, roots, what=what)  # before looking: outside, existence is not told
    try:
        resolved = path.resolve(strict=True)
    except (OSError, RuntimeError):  # missing, unreadable, or a symlink loop
        raise SourceNotFound(f"{what} does not exist or cannot be read", param=PARAM) from None
    if roots is not None:
        _inside(resolved, roots, what=f"{what} (resolved: {resolved})")
    for internal in _tenant_folders():
        if resolved.is_relative_to(internal):
            raise SourceNotAllowed(
                f"{what} lies in {internal}, where this deployment keeps tenants' files",
                param=PARAM,
            )
    return resolved


def _inside(path: Path, roots: tuple[Path, ...], *, what: str) -> None:
    if not any(path.is_relative_to(root) for root in roots):
        listed = ", ".join(map(str, roots)) or "none are set"
        raise SourceNotAllowed(
            f"{what} is not under a folder open to operators' loads (LORAPLEX_LORA_PATH_ROOTS: "
            f"{listed})",
            param=PARAM,
        )


def _tenant_folders() -> list[Path]:
    """The adapter cache and, when storage is a local folder, the object store."""
    folders = [Path(settings.ADAPTER_CACHE_DIR).resolve()]
    backend = storage()
    if isinstance(backend, FileSystemStorage):
        folders.append(Path(backend.location).resolve())
    return folders


@contextmanager
def open_lora_source(source: LoraSource) -> Iterator[tuple[BinaryIO, BinaryIO]]:
    """Yields the (config, weights) files: opened in place, or downloaded from S3 first."""
    if isinstance(source, S3Location):
        with s3_import(source) as files:
            yield files
        return
    config, weights = (_file_in(source, name) for name in (CONFIG_FILE, WEIGHTS_FILE))
    with open(config, "rb") as config_file, open(weights, "rb") as weights_file:
        yield config_file, weights_file


def _file_in(folder: LocalFolder, name: str) -> Path:
    where = f"{folder.path / name}"
    resolved = _readable(folder.path / name, folder.roots, what=where)
    if not resolved.is_file():
        raise SourceNotFound(f"{where} is not a file", param=PARAM)
    return resolved
