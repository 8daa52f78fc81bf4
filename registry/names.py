"""Naming rules for adapters, aliases and base models (model strings: registry/model_names.py).

Names end up in URLs, model strings (`<adapter>@<alias>`, `<adapter>:<n>`) and audit
trails, never in file paths (storage keys and cache folders use ids), yet they are kept to
a strict slug so that `../`, `@`, `:` and look-alike characters are refused at the edge.
"""

import re

from django.core.validators import RegexValidator

from .errors import InvalidAlias, InvalidName

SLUG_PATTERN = r"[a-z0-9][a-z0-9_-]{0,62}"
BASE_MODEL_PATTERN = r"[a-z0-9][a-z0-9._-]{0,99}"
SLUG_RULE = "lowercase letters, digits, '-' and '_', starting with a letter or digit, at most 63"

adapter_name_validator = RegexValidator(
    rf"^{SLUG_PATTERN}\Z", f"Adapter names use {SLUG_RULE} characters.", code=InvalidName.code
)
alias_name_validator = RegexValidator(
    rf"^{SLUG_PATTERN}\Z", f"Alias names use {SLUG_RULE} characters.", code=InvalidAlias.code
)
base_model_name_validator = RegexValidator(
    rf"^{BASE_MODEL_PATTERN}\Z",
    "Base model names use lowercase letters, digits, '.', '-' and '_' (at most 100).",
    code=InvalidName.code,
)

PRODUCTION = "production"
CANARY = "canary"
LATEST = "latest"
_VERSION_ALIAS = re.compile(r"v([1-9][0-9]*)")


def reserved_alias_reason(name: str) -> str | None:
    """Why a name cannot be set as an alias: `latest` and `v<N>` always mean what they say."""
    if name == LATEST:
        return "'latest' is reserved: it always means the newest ready version."
    if _VERSION_ALIAS.fullmatch(name) or re.fullmatch(r"v[0-9]+", name):
        return f"'{name}' is reserved: v<N> always means version N."
    return None


def version_number_of_alias(name: str) -> int | None:
    """`v3` -> 3; anything else -> None."""
    match = _VERSION_ALIAS.fullmatch(name)
    return int(match[1]) if match else None
