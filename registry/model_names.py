"""How a model string names an adapter version: built and parsed here, on both sides of the wire.

A tenant's request says `adapter`, `adapter@alias` or `adapter:n` (its tenant is implied).
Operators act across tenants, so their names are qualified: `tenant/adapter[@alias|:n]`;
the control plane builds those (registry/engines.py, the admin's pin actions), and the
engine's operator endpoints and LORAPLEX_PINNED_ADAPTERS parse them.
"""

import re
from dataclasses import dataclass, replace

from .names import SLUG_PATTERN

TENANT_PATTERN = r"[A-Za-z0-9_-]{1,63}"  # a Tenant.slug (a SlugField)
NUMBER_PATTERN = r"[1-9][0-9]{0,8}"


@dataclass(frozen=True)
class ModelRef:
    """An adapter, optionally how to pick its version, and (operators only) whose it is."""

    adapter: str
    alias: str | None = None
    number: int | None = None
    tenant: str | None = None

    @property
    def model(self) -> str:
        """The name as the tenant itself says it, without the tenant."""
        return str(replace(self, tenant=None))

    def __str__(self) -> str:
        name = self.adapter if self.tenant is None else f"{self.tenant}/{self.adapter}"
        if self.alias is not None:
            return f"{name}@{self.alias}"
        return name if self.number is None else f"{name}:{self.number}"


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
        if re.fullmatch(SLUG_PATTERN, name) and re.fullmatch(NUMBER_PATTERN, number):
            return ModelRef(adapter=name, number=int(number))
        return None
    return ModelRef(adapter=model) if re.fullmatch(SLUG_PATTERN, model) else None


def parse_qualified_name(name: str) -> ModelRef | None:
    """`tenant/bot`, `tenant/bot@canary`, `tenant/bot:3`; None for anything else."""
    if not isinstance(name, str):
        return None
    tenant, sep, model = name.partition("/")
    if not sep or not re.fullmatch(TENANT_PATTERN, tenant):
        return None
    ref = parse_model_name(model)
    return None if ref is None else replace(ref, tenant=tenant)


def version_name(version) -> str:
    """`tenant/adapter:n`: one exact version, as the engine's LoRARequest and operators name it."""
    adapter = version.adapter
    return str(ModelRef(adapter.name, number=version.number, tenant=adapter.tenant.slug))


def alias_name(alias, *, qualified: bool = True) -> str:
    """`tenant/adapter@alias` for operators; `adapter@alias` (qualified=False) for the tenant."""
    adapter = alias.adapter
    tenant = adapter.tenant.slug if qualified else None
    return str(ModelRef(adapter.name, alias=alias.name, tenant=tenant))
