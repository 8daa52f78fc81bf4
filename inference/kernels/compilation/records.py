"""What earlier compiles found, kept beside the code so a check need not compile it again.

A variant is known by a fingerprint of everything its compiled form depends on: the Triton
version (which ships the ptxas that measures it), the target, the kernel's source hash
(Triton's own `cache_key`, which follows the functions it calls) and the launch key. A
record maps fingerprints to what compiling found; a change to a kernel, to Triton or to a
launch makes new fingerprints, and those variants are compiled. A record is trusted only
as far as it is checked: the check compiles again the first recorded variant of every
kernel and dtype it meets and fails when the two disagree.
"""

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import triton

from .launches import LaunchKey
from .resources import Resources


def fingerprint(kernel: Any, key: LaunchKey, arch: int) -> str:
    text = repr((triton.__version__, arch, kernel.cache_key, key))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def record_path(folder: Path) -> Path:
    """The record of this Triton version in `folder`."""
    return folder / f"triton-{triton.__version__}.json"


def load_record(path: Path) -> dict[str, Resources]:
    """The variants `path` records (none when it does not exist)."""
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    if data.get("triton") != triton.__version__:
        raise ValueError(f"{path} records Triton {data.get('triton')}, not {triton.__version__}")
    return {
        fp: Resources(shared, registers, stores, loads)
        for fp, (_kernel, _target, _dtype, shared, registers, stores, loads) in data[
            "variants"
        ].items()
    }


def write_record(path: Path, rows: Iterable[Mapping[str, Any]]) -> int:
    """Record every variant of `rows` (the compile table) that compiled; their count."""
    variants = {
        row["fingerprint"]: [row["kernel"], row["target"], row["dtype"], row["shared"],
                             row["registers"], row["spill_stores"], row["spill_loads"]]
        for row in rows
        if "shared" in row
    }  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    body = ",\n".join(f"  {json.dumps(fp)}: {json.dumps(v)}" for fp, v in sorted(variants.items()))
    path.write_text(f'{{"triton": {json.dumps(triton.__version__)}, "variants": {{\n{body}\n}}}}\n')
    return len(variants)
