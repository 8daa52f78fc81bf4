"""The registry's validator: two local files in, a report a person can read out.

The PEFT rules live once, in `inference.engine.lora.peft_rules.check_adapter`; this module adds
only what belongs to the registry (sizes, the integrity of the stored bytes, refusing to
look further at a file that is not safetensors) and the report format. It is a pure
function of its inputs: no database, no storage, no Django settings, and for any bytes it
returns a `ValidationResult` (never raises on bad content).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from inference.engine.formats.safetensors_header import HeaderError, parse_header
from inference.engine.lora.peft_rules import (
    CONFIG_FILE,
    MAX_ADAPTER_HEADER_BYTES,
    WEIGHTS_FILE,
    AdapterError,
    AdapterSpec,
    ArchFingerprint,
    Check,
    check_adapter,
    parse_config,
)

from .objectstore import Digest


def printable(value):
    """Reports quote the upload's own strings; NUL cannot be stored (PostgreSQL text/jsonb)."""
    if isinstance(value, str):
        return value.replace("\x00", "\\x00")
    if isinstance(value, list | tuple):
        return [printable(v) for v in value]
    if isinstance(value, dict):
        return {printable(k): printable(v) for k, v in value.items()}
    return value


@dataclass
class ValidationResult:
    checks: list[Check]
    spec: AdapterSpec | None = None
    config: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.spec is not None and all(c.passed for c in self.checks if c.level == "error")

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.passed and c.level == "error"]

    def report(self) -> list[dict]:
        return [printable(c.to_dict()) for c in self.checks]

    def summary(self) -> str:
        if self.ok:
            warnings = [c for c in self.checks if not c.passed]
            note = f"; {len(warnings)} warning(s): " + "; ".join(c.message for c in warnings)
            text = f"passed {len(self.checks)} checks" + (note if warnings else "")
        else:
            text = "; ".join(f"{c.name}: {c.message}" for c in self.failures)
        return printable(text or "no usable adapter")


def integrity_check(*, recorded: dict[str, Digest], fetched: dict[str, Digest]) -> Check:
    """The bytes read back from storage are exactly the bytes uploaded."""
    wrong = [
        f"{name} has sha256 {fetched[name].sha256[:16]}… ({fetched[name].size} bytes), "
        f"recorded {recorded[name].sha256[:16]}… ({recorded[name].size} bytes)"
        for name in recorded
        if fetched[name] != recorded[name]
    ]
    if wrong:
        return Check("sha256", False, "stored bytes changed since upload: " + "; ".join(wrong))
    return Check("sha256", True, "stored bytes match the sha256 recorded at upload")


def _size_checks(config_size: int, weights_size: int, *, max_config: int, max_weights: int):
    checks = []
    for name, file, size, limit in (
        ("config_size", CONFIG_FILE, config_size, max_config),
        ("weights_size", WEIGHTS_FILE, weights_size, max_weights),
    ):
        if size > limit:
            checks.append(
                Check(name, False, f"{file} is {size} bytes, above the {limit}-byte limit")
            )
        else:
            checks.append(Check(name, True, f"{size} bytes"))
    return checks


def _reference_loader_check(weights_path: Path, names: set[str]) -> Check:
    """The engine loads with `safetensors.safe_open`; a file it refuses must never be ready.

    A second opinion on the header (not on the PEFT rules): the Rust loader reads only the
    header here and maps the file, so this costs little. It once caught a header our own
    parser accepted (a non-standard JSON constant such as Infinity, refused there since).
    """
    from safetensors import safe_open

    try:
        with safe_open(weights_path, framework="numpy") as f:
            listed = set(f.keys())
    except Exception as exc:  # SafetensorError, or anything the Rust loader raises
        return Check("reference_loader", False, f"safetensors refuses {WEIGHTS_FILE}: {exc}")
    if listed != names:
        return Check(
            "reference_loader", False, "safetensors reads other tensors than the header lists"
        )
    return Check("reference_loader", True, "safetensors opens the file")


def validate_adapter_files(
    config_path: str | os.PathLike,
    weights_path: str | os.PathLike,
    *,
    fingerprint: ArchFingerprint,
    max_lora_rank: int,
    max_saved_params: int | None = None,
    max_config_bytes: int,
    max_weights_bytes: int,
    base_model_name: str | None = None,
    check_values: bool = True,
    prior_checks: Sequence[Check] = (),
) -> ValidationResult:
    """Every check on an adapter's two files; `check_values=False` reads only the header."""
    checks = list(prior_checks)
    if any(not c.passed and c.level == "error" for c in checks):
        return ValidationResult(checks)
    config_path, weights_path = Path(config_path), Path(weights_path)
    checks += _size_checks(
        config_path.stat().st_size,
        weights_path.stat().st_size,
        max_config=max_config_bytes,
        max_weights=max_weights_bytes,
    )
    if not all(c.passed for c in checks):
        return ValidationResult(checks)

    config = None
    try:
        config = parse_config(config_path.read_bytes())
        checks.append(Check("config", True, f"{CONFIG_FILE} is a JSON object"))
    except AdapterError as exc:
        checks.append(Check("config", False, str(exc)))
    try:
        header = parse_header(weights_path, max_header_bytes=MAX_ADAPTER_HEADER_BYTES)
        checks.append(
            Check("safetensors", True, f"{len(header.tensors)} tensors in a well-formed header")
        )
    except HeaderError as exc:
        checks.append(Check("safetensors", False, f"{WEIGHTS_FILE}: {exc}"))
        return ValidationResult(checks, config=config or {})
    checks.append(_reference_loader_check(weights_path, set(header.tensors)))
    if config is None:
        return ValidationResult(checks)

    report = check_adapter(
        config,
        header,
        fingerprint,
        max_lora_rank=max_lora_rank,
        max_saved_params=max_saved_params,
        weights_path=weights_path if check_values else None,
        expected_base_name=base_model_name,
    )
    checks += report.checks
    return ValidationResult(checks, spec=report.spec if report.ok else None, config=config)
