"""The local adapter cache: ready versions copied from object storage to this host's disk.

One folder per version, `<cache>/<version uid>/` holding `adapter_config.json` and
`adapter_model.safetensors`, which is exactly what the engine's loader reads. A folder
appears only whole (downloaded into a temporary sibling, sha256 verified, stamped, then
renamed), so its existence means it was complete. A copy damaged on disk since (a file
written, truncated, rotted) is found by its stamps, or when the engine cannot load it
(staged_copies.py), and staged again from object storage. The cache keeps to a byte budget
by evicting the least recently used folders; versions an alias points at are pinned and
never evicted.
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

from . import objectstore, staged_copies
from .errors import NotServable, RegistryError, UploadTooLarge
from .models import AdapterVersion
from .objectstore import Digest
from .validation import integrity_check

log = logging.getLogger(__name__)
STALE_TEMP_SECONDS = 3600
MISSING = "missing"  # not on this host's disk: a plain miss, not a restage


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


def is_staged(version: AdapterVersion) -> bool:
    """Whether this host's cache holds the version whole and unwritten since its bytes were
    verified (two stat calls: no download, no hashing; the request path asks this)."""
    return staged_copies.seen_damage(version_dir(version), recorded_digests(version)) is None


def _damage(folder: Path, version: AdapterVersion, *, suspect: bool) -> str | None:
    """None when the folder holds the validated bytes, MISSING when there is none, else how
    its damage was found (a restage reason). Bytes are hashed only where a stamp is wrong,
    or where the engine could not load the folder (`suspect`)."""
    if not folder.is_dir():
        return MISSING
    recorded = recorded_digests(version)
    seen = staged_copies.seen_damage(folder, recorded)
    if seen == staged_copies.SIZE or (seen is None and not suspect):
        return seen
    if not staged_copies.intact(folder, recorded):
        return staged_copies.LOAD_FAILED if suspect else staged_copies.MODIFIED
    if seen is not None:  # the bytes are right, the stamps not (staged before them, touched)
        staged_copies.stamp(folder, recorded)
        staged_copies.remember(folder, recorded)
    return None


def _fsync(folder: Path, *, files: bool = True) -> None:
    """Flush a folder's files and its entries: after a power cut, a folder that exists under
    its final name still holds every byte (a killed process needs none of this)."""
    for path in [*(folder.iterdir() if files else ()), folder]:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def ensure_staged(version: AdapterVersion, *, suspect: bool = False) -> Path:
    """The local folder of a ready version, downloading it first on a cache miss, and again
    when the copy there is damaged (counted, by how it was found, in staged_copies).

    `suspect`: the engine could not load the folder, so its bytes are read in full. The
    Celery staging task, the prefetcher and the engine's loader call this.
    """
    folder = version_dir(version)
    damage = _damage(folder, version, suspect=suspect)
    if damage is None:
        os.utime(folder)  # the LRU clock
        return folder
    if damage != MISSING:
        log.warning("%s: its staged copy is damaged (%s); staging it again", version.label, damage)
        _remove(folder)  # never read again, whatever happens next
    if version.status != AdapterVersion.READY:
        raise NotServable(f"{version.label} is {version.status}; only ready versions are staged")
    if damage != MISSING:
        staged_copies.count_restage(damage)
    _stage_into(folder, version)
    evict(keep={version.uid.hex})
    return folder


def _stage_into(folder: Path, version: AdapterVersion) -> None:
    """Download into a temporary sibling, verify and stamp it, then rename it into place."""
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    recorded = recorded_digests(version)
    tmp = Path(tempfile.mkdtemp(prefix=f".{version.uid.hex}.", suffix=".tmp", dir=root))
    try:
        check = download_version(version, tmp)
        if not check.passed:
            raise StagingError(f"{version.label}: {check.message}")
        staged_copies.stamp(tmp, recorded)  # hashed on the way in: verified
        tmp.chmod(0o755)
        _fsync(tmp)  # the bytes reach the disk before the name does
        # A concurrent stager (the worker, this replica's prefetcher, the engine's loader)
        # may have put it in place meanwhile: a copy that looks whole is never replaced,
        # since its stager's caller may be reading it now.
        if staged_copies.seen_damage(folder, recorded) is not None:
            if folder.exists():  # damaged, or staged before stamps: replace it
                _remove(folder)
            try:
                tmp.rename(folder)
            except OSError:
                if staged_copies.seen_damage(folder, recorded) is not None:
                    raise  # else a concurrent stager won the race
            else:
                staged_copies.remember(folder, recorded)
            _fsync(root, files=False)  # and the rename itself survives a crash
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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


# Copies staged ahead of any request (an engine replica's prefetcher) carry a mark, an empty
# file `<cache>/<version uid>.prefetched` beside the folder (`evict` reads only folders), until
# the replica is seen serving them. Marked copies live within their own budget, and go first,
# before anything served and whether an alias points at them or not: a replica never holds
# for long what routing does not send it. The marks survive a restart, as the folders do.
PREFETCHED_SUFFIX = ".prefetched"


def _prefetch_mark(uid: str) -> Path:
    return cache_dir() / f"{uid}{PREFETCHED_SUFFIX}"


def mark_prefetched(version: AdapterVersion) -> None:
    """Before staging `version` ahead of any request: it is the first to go."""
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    mark = _prefetch_mark(version.uid.hex)
    mark.touch()
    now = time.time_ns()  # finer than the file system's clock: marks a moment apart keep order
    os.utime(mark, ns=(now, now))


def unmark_prefetched(uid: str) -> None:
    """Served since: from now on the cache's ordinary LRU (and alias pins) keep it."""
    _prefetch_mark(uid).unlink(missing_ok=True)


def prefetched_copies() -> dict[str, int]:
    """Marked copies on disk, oldest mark first: uid -> bytes. A mark whose folder is gone
    (evicted, unstaged, or its staging failed) is dropped."""
    root = cache_dir()
    marks = []
    for mark in root.glob(f"*{PREFETCHED_SUFFIX}") if root.is_dir() else ():
        uid = mark.name.removesuffix(PREFETCHED_SUFFIX)
        try:
            marks.append((mark.stat().st_mtime, uid, _folder_size(root / uid)))
        except FileNotFoundError:  # no folder (or no mark any more)
            unmark_prefetched(uid)
    return {uid: size for _, uid, size in sorted(marks)}


def cache_bytes() -> int:
    """Bytes of every complete folder in this host's cache."""
    root = cache_dir()
    total = 0
    for entry in root.iterdir() if root.is_dir() else ():
        try:
            if not entry.name.startswith(".") and entry.is_dir():
                total += _folder_size(entry)
        except FileNotFoundError:  # removed meanwhile by another stager
            continue
    return total


def evict_prefetched(*, served: AbstractSet[str], room: int, budget: int) -> list[str]:
    """Make `room` bytes for one more prefetched copy: unmark the copies in `served` (uids
    the engine has loaded), then drop the others, oldest first, until they fit `budget` and
    the whole cache fits its own budget, each with `room` to spare."""
    marked = prefetched_copies()
    for uid in [uid for uid in marked if uid in served]:
        unmark_prefetched(uid)
        del marked[uid]
    held, total = sum(marked.values()), cache_bytes()
    evicted = []
    for uid, size in marked.items():
        if held + room <= budget and total + room <= settings.ADAPTER_CACHE_BYTES:
            break
        _remove(cache_dir() / uid)
        unmark_prefetched(uid)
        held, total = held - size, total - size
        evicted.append(uid)
    return evicted
