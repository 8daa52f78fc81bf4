"""Naming rules for adapters, aliases and base models, and how a model string names a version.

Names end up in URLs, model strings (`<adapter>@<alias>`, `<adapter>:<n>`) and audit
trails, never in file paths (storage keys and cache folders use ids), yet they are kept to
a strict slug so that `../`, `@`, `:` and look-alike characters are refused at the edge.
"""

import re
from dataclasses import dataclass

from django.core.validators import RegexValidator

SLUG_PATTERN = r"[a-z0-9][a-z0-9_-]{0,62}"
BASE_MODEL_PATTERN = r"[a-z0-9][a-z0-9._-]{0,99}"
SLUG_RULE = "lowercase letters, digits, '-' and '_', starting with a letter or digit, at most 63"

adapter_name_validator = RegexValidator(
    rf"^{SLUG_PATTERN}\Z", f"Adapter names use {SLUG_RULE} characters.", code="invalid_name"
)
alias_name_validator = RegexValidator(
    rf"^{SLUG_PATTERN}\Z", f"Alias names use {SLUG_RULE} characters.", code="invalid_alias"
)
base_model_name_validator = RegexValidator(
    rf"^{BASE_MODEL_PATTERN}\Z",
    "Base model names use lowercase letters, digits, '.', '-' and '_' (at most 100).",
    code="invalid_name",
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


@dataclass(frozen=True)
class ModelRef:
    """What an inference request's `model` names: an adapter, and optionally how to pick a version."""

    adapter: str
    alias: str | None = None
    number: int | None = None


def parse_model_name(model: str) -> ModelRef | None:
    """`bot`, `bot@canary`, `bot:3`; None when the string cannot name an adapter at all."""
    if not isinstance(model, str):
        return None
    name, sep, alias = model.partition("@")
    if sep:
        if re.fullmatch(SLUG_PATTERN, name) and re.fullmatch(SLUG_PATTERN, alias):
            return ModelRef(adapter=name, alias=alias)
        return None
    name, sep, number = model.partition(":")
    if sep:
        if re.fullmatch(SLUG_PATTERN, name) and re.fullmatch(r"[1-9][0-9]{0,8}", number):
            return ModelRef(adapter=name, number=int(number))
        return None
    return ModelRef(adapter=model) if re.fullmatch(SLUG_PATTERN, model) else None
