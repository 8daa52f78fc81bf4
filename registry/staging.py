"""The local adapter cache: ready versions copied from object storage to this host's disk.

One folder per version, `<cache>/<version uid>/` holding `adapter_config.json` and
`adapter_model.safetensors`, which is exactly what the engine's loader reads. A folder
appears only whole (downloaded into a temporary sibling, sha256 verified, then renamed),
so its existence means it is complete. The cache keeps to a byte budget by evicting the
least recently used folders; versions an alias points at are pinned and never evicted.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Set as AbstractSet
from pathlib import Path

from django.conf import settings

from inference.engine.lora.peft_rules import CONFIG_FILE, WEIGHTS_FILE, Check

from . import objectstore
from .errors import NotServable, RegistryError, UploadTooLarge
from .models import AdapterVersion
from .objectstore import Digest
from .validation import integrity_check

log = logging.getLogger(__name__)
STALE_TEMP_SECONDS = 3600


class StagingError(RegistryError, status=500, code="staging_integrity"):
    """The stored bytes are not the bytes that were validated; they must never be served."""


def cache_dir() -> Path:
    return Path(settings.ADAPTER_CACHE_DIR)


def version_dir(version: AdapterVersion) -> Path:
    return cache_dir() / version.uid.hex


def recorded_digests(version: AdapterVersion) -> dict[str, Digest]:
    return {
        CONFIG_FILE: Digest(version.config_sha256, version.config_size),
        WEIGHTS_FILE: Digest(version.weights_sha256, version.weights_size),
    }


def download_version(version: AdapterVersion, dest: Path) -> Check:
    """Copy both objects into `dest` (streamed, hashed); the check says if they are intact.

    Raises StorageUnavailable (retry) or ObjectMissing (will not come back).
    """
    recorded = recorded_digests(version)
    fetched = {}
    for file, key in ((CONFIG_FILE, version.config_key), (WEIGHTS_FILE, version.weights_key)):
        try:
            fetched[file] = objectstore.fetch(key, dest / file, limit=recorded[file].size)
        except UploadTooLarge:
            return Check(
                "sha256",
                False,
                f"stored {file} is larger than the {recorded[file].size} bytes uploaded",
            )
    return integrity_check(recorded=recorded, fetched=fetched)


def _is_complete(folder: Path, version: AdapterVersion) -> bool:
    try:
        return (folder / CONFIG_FILE).stat().st_size == version.config_size and (
            folder / WEIGHTS_FILE
        ).stat().st_size == version.weights_size
    except OSError:
        return False


def is_staged(version: AdapterVersion) -> bool:
    """Whether this host's cache holds the version whole (two stat calls, no download)."""
    return _is_complete(version_dir(version), version)


def _fsync(folder: Path, *, files: bool = True) -> None:
    """Flush a folder's files and its entries: after a power cut, a folder that exists under
    its final name still holds every byte (a killed process needs none of this)."""
    for path in [*(folder.iterdir() if files else ()), folder]:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def ensure_staged(version: AdapterVersion) -> Path:
    """The local folder of a ready version, downloading it first on a cache miss.

    The Celery staging task and the serving layer's cache-miss path both call this.
    """
    folder = version_dir(version)
    if _is_complete(folder, version):
        os.utime(folder)  # the LRU clock
        return folder
    if version.status != AdapterVersion.READY:
        raise NotServable(f"{version.label} is {version.status}; only ready versions are staged")
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{version.uid.hex}.", suffix=".tmp", dir=root))
    try:
        check = download_version(version, tmp)
        if not check.passed:
            raise StagingError(f"{version.label}: {check.message}")
        tmp.chmod(0o755)
        _fsync(tmp)  # the bytes reach the disk before the name does
        # A concurrent stager (the worker, this replica's prefetcher, the engine's loader)
        # may have put it in place meanwhile: a complete folder is never replaced, since
        # its stager's caller may be reading it now.
        if not _is_complete(folder, version):
            if folder.exists():  # damaged (sizes differ): replace it
                _remove(folder)
            try:
                tmp.rename(folder)
            except OSError:
                if not _is_complete(folder, version):  # else a concurrent stager won the race
                    raise
            _fsync(root, files=False)  # and the rename itself survives a crash
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    evict(keep={version.uid.hex})
    return folder


def stage_version(*, version_id: int) -> Path | None:
    """The staging task's service: stage a ready version by id; anything else is a no-op."""
    version = AdapterVersion.objects.select_related("adapter").filter(pk=version_id).first()
    if version is None or version.status != AdapterVersion.READY:
        return None
    return ensure_staged(version)


def pinned_uids() -> set[str]:
    """Versions some alias points at: rollouts in progress must not fall out of the cache."""
    return {
        uid.hex
        for uid in AdapterVersion.objects.filter(aliases__isnull=False).values_list(
            "uid", flat=True
        )
    }


def _folder_size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.iterdir() if f.is_file())


def _remove(folder: Path) -> None:
    """Rename first, so a reader never sees a half-deleted folder as complete."""
    doomed = folder.with_name(f".{folder.name}.evicted-{time.monotonic_ns()}")
    try:
        folder.rename(doomed)
    except FileNotFoundError:
        return
    shutil.rmtree(doomed, ignore_errors=True)


def evict(*, keep: AbstractSet[str] = frozenset(), budget: int | None = None) -> list[str]:
    """Drop least recently used, unpinned folders until the cache fits its budget."""
    budget = settings.ADAPTER_CACHE_BYTES if budget is None else budget
    root = cache_dir()
    if not root.is_dir():
        return []
    now, entries = time.time(), []
    for entry in root.iterdir():
        # Other stagers (the worker, a replica's prefetcher, the engine's loader) rename and
        # remove entries meanwhile: one gone since the listing is simply skipped.
        try:
            mtime = entry.stat().st_mtime
            if entry.name.startswith("."):
                if mtime < now - STALE_TEMP_SECONDS:  # a crashed stager's leftovers
                    shutil.rmtree(entry, ignore_errors=True)
            elif entry.is_dir():
                entries.append((mtime, entry, _folder_size(entry)))
        except FileNotFoundError:
            continue
    sizes = {folder: size for _, folder, size in entries}
    total = sum(sizes.values())
    if total <= budget:
        return []
    protected = set(keep) | pinned_uids()
    evicted = []
    for _, folder, _ in sorted(entries, key=lambda e: e[0]):
        if total <= budget:
            break
        if folder.name in protected:
            continue
        _remove(folder)
        total -= sizes[folder]
        evicted.append(folder.name)
    if total > budget:
        log.warning(
            "adapter cache holds %d bytes of pinned versions, over its budget %d", total, budget
        )
    return evicted


def unstage(version: AdapterVersion) -> None:
    """Drop this host's copy (the adapter was deleted)."""
    _remove(version_dir(version))
