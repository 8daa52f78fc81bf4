"""Whether a folder in the local adapter cache still holds the bytes that were validated.

Two checks, for two moments. The stamp costs a stat: once a folder's files are verified
against the sha256 recorded at validation (on staging, or later), the nanoseconds of each
file's modification time are set to a value derived from its digest (the second stays the
one it was verified in), and any write to the file moves them.
`seen_damage` reads sizes and stamps only, so the request path may ask it every time. The
full check reads every byte (`intact`): staging (staging.py) runs it where a stamp is
wrong and where the engine could not load the folder, on a loader or worker thread, never
per request. A folder this process hashed, and that nothing has touched since (the same
inode, size and times), is not hashed again, so a version that fails to load for another
reason is not read in full on every try.

The restages these checks lead to are counted here, by how the damage was found, for
/metrics (inference/metrics.py) to export.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from pathlib import Path

from .errors import UploadTooLarge
from .objectstore import Digest, file_chunks, hash_stream

SIZE, MODIFIED, LOAD_FAILED = "size", "modified", "load_failed"
RESTAGE_REASONS = (SIZE, MODIFIED, LOAD_FAILED)
_REMEMBERED = 1024  # folders whose verified state this process keeps

_lock = threading.Lock()
_restages: Counter[str] = Counter()
_verified: dict[str, tuple] = {}  # folder -> its files' (inode, size, times) when hashed


def stamp_of(digest: Digest) -> int:
    """The nanoseconds of a verified file's modification time. (A file system that keeps
    whole seconds only cannot hold it: its copies are checked in full where they are
    loaded, each once per change, never on the request path.)"""
    return int(digest.sha256[:8], 16) % 10**9


def stamp(folder: Path, recorded: dict[str, Digest]) -> None:
    """Mark the folder's files verified; call only once their bytes were checked."""
    for name, digest in recorded.items():
        path = folder / name
        st = path.stat()
        second = st.st_mtime_ns - st.st_mtime_ns % 10**9
        os.utime(path, ns=(st.st_atime_ns, second + stamp_of(digest)))


def seen_damage(folder: Path, recorded: dict[str, Digest]) -> str | None:
    """From stat calls alone: SIZE (a file missing or of another size), MODIFIED (written,
    or never stamped, since it was verified), or None (it looks as verified)."""
    stamped = True
    for name, digest in recorded.items():
        try:
            st = (folder / name).stat()
        except OSError:
            return SIZE
        if st.st_size != digest.size:
            return SIZE
        stamped = stamped and st.st_mtime_ns % 10**9 == stamp_of(digest)
    return None if stamped else MODIFIED


def intact(folder: Path, recorded: dict[str, Digest]) -> bool:
    """Every file's sha256 is the recorded one (read in full, unless unchanged since this
    process last found it so)."""
    key, before = str(folder), _signature(folder, recorded)
    with _lock:
        if before is not None and _verified.get(key) == before:
            return True
    for name, digest in recorded.items():
        try:
            with open(folder / name, "rb") as f:
                if hash_stream(file_chunks(f), limit=digest.size) != digest:
                    return False
        except (OSError, UploadTooLarge):
            return False
    if before is not None and _signature(folder, recorded) == before:  # not written meanwhile
        _keep(key, before)
    return True


def remember(folder: Path, recorded: dict[str, Digest]) -> None:
    """The folder's files, as they are now, hold the recorded bytes (just staged)."""
    signature = _signature(folder, recorded)
    if signature is not None:
        _keep(str(folder), signature)


def _keep(key: str, signature: tuple) -> None:
    with _lock:
        _verified.pop(key, None)
        _verified[key] = signature
        while len(_verified) > _REMEMBERED:
            del _verified[next(iter(_verified))]


def _signature(folder: Path, recorded: dict[str, Digest]) -> tuple | None:
    try:
        stats = [(folder / name).stat() for name in recorded]
    except OSError:
        return None
    return tuple((s.st_ino, s.st_size, s.st_mtime_ns, s.st_ctime_ns) for s in stats)


def count_restage(reason: str) -> None:
    with _lock:
        _restages[reason] += 1


def restage_counts() -> dict[str, int]:
    """Restages in this process since it started, by reason (every reason, zeros too)."""
    with _lock:
        return {reason: _restages[reason] for reason in RESTAGE_REASONS}
