""".env.example, the documented settings with their example values."""

import re

from tests.processes import ROOT

ENV_EXAMPLE = ROOT / ".env.example"


def env_example() -> dict[str, str]:
    """The active KEY=VALUE lines."""
    values = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line and not line.startswith("#"):
            key, sep, value = line.partition("=")
            assert sep and re.fullmatch(r"[A-Z][A-Z0-9_]*", key), line
            assert " #" not in value, f"no inline comments on active lines: {line}"
            values[key] = value
    return values
