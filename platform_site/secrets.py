"""The development SECRET_KEY: generated once per var dir, so restarts keep sessions and keys."""

import contextlib
import os
import secrets
from pathlib import Path


def development_secret_key(var_dir: Path) -> str:
    path = var_dir / "secret_key"
    if not path.exists():
        var_dir.mkdir(parents=True, exist_ok=True)
        _create_once(path, secrets.token_urlsafe(50))
    return path.read_text().strip()


def _create_once(path: Path, key: str) -> None:
    """Written to a private temporary file opened 0600 (never readable by others, not even for
    a moment), then linked into place: link never overwrites, so when two processes start
    together the first one's key wins and both read that one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(key)
            out.flush()
            os.fsync(out.fileno())
        with contextlib.suppress(FileExistsError):  # another process was first: its key wins
            os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
