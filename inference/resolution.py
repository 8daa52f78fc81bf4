"""Model name -> what the engine runs. The one place inference requests meet tenant isolation.

`<base model name>` means no adapter; `<adapter>` follows the `production` alias (a canary
takes its weight's share); `<adapter>@<alias>` and `<adapter>:<n>` are explicit. Any name
that does not resolve within the caller's tenant is `ModelNotFound`, with the same message
whether it does not exist or belongs to someone else.
"""

from dataclasses import dataclass

from django.http import Http404

from registry.errors import NotServable
from registry.names import parse_model_name
from registry.selectors import adapter_version_resolve


class ModelNotFound(Exception):
    def __init__(self, name: str):
        super().__init__(f"The model '{name}' does not exist or you do not have access to it.")


class ModelNotServable(Exception):
    """The name resolves, but to a version that may not run here (not ready, incompatible)."""


@dataclass(frozen=True)
class ResolvedModel:
    requested: str
    version: object | None = None  # registry AdapterVersion, None for the base model
    lora_request: object | None = None  # what the engine gets (None for the base model)


def lora_request_for(version):
    """Built here, in sync code: it reads the version's adapter and tenant rows."""
    from inference.engine.lora import LoRARequest

    name = f"{version.adapter.tenant.slug}/{version.adapter.name}:{version.number}"
    # path None: the engine asks its loader, which stages the version from object storage.
    return LoRARequest(name=name, adapter_id=str(version.uid), path=None)


def resolve_model(*, tenant, name: str, base_model_name: str, roll: float | None = None) -> ResolvedModel:
    if name == base_model_name:
        return ResolvedModel(requested=name)
    ref = parse_model_name(name)
    if ref is None:
        raise ModelNotFound(name)
    try:
        version = adapter_version_resolve(
            tenant=tenant, adapter_name=ref.adapter, alias=ref.alias, number=ref.number, roll=roll
        )
    except Http404:
        raise ModelNotFound(name) from None
    except NotServable as exc:
        raise ModelNotServable(f"The model '{name}' cannot be served: {exc}") from None
    return ResolvedModel(requested=name, version=version, lora_request=lora_request_for(version))
