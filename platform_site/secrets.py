"""The development SECRET_KEY: generated once per var dir, so restarts keep sessions and keys."""

import secrets
from pathlib import Path


def development_secret_key(var_dir: Path) -> str:
    path = var_dir / "secret_key"
    if not path.exists():
        var_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(secrets.token_urlsafe(50))
        tmp.chmod(0o600)
        tmp.replace(path)  # atomic: two processes starting together agree on one key
    return path.read_text().strip()
