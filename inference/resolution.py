"""Model name -> what the engine runs. The one place inference requests meet tenant isolation.

`<base model name>` means no adapter; `<adapter>` follows the `production` alias (a canary
takes its weight's share); `<adapter>@<alias>` and `<adapter>:<n>` are explicit. Any name
that does not resolve within the caller's tenant is `ModelNotFound`, with the same message
whether it does not exist or belongs to someone else.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.http import Http404

from registry.errors import NotServable
from registry.model_names import parse_model_name, version_name
from registry.selectors import adapter_version_resolve, base_model_find
from registry.staging import is_staged, version_dir

from .errors import BaseModelUnavailable, ModelNotFound, ModelNotServable

if TYPE_CHECKING:
    from inference.engine import LoRARequest
    from registry.models import AdapterVersion


@dataclass(frozen=True)
class ResolvedModel:
    requested: str
    version: "AdapterVersion | None" = None  # None for the base model
    lora_request: "LoRARequest | None" = None  # what the engine gets (None for the base model)


def lora_request_for(version):
    """Built here, in sync code: it reads the version's adapter and tenant rows."""
    from inference.engine import LoRARequest

    # Already in this replica's local cache (staged in the background: host/prefetch.py):
    # the engine reads it from disk. Else path None: the engine asks its loader, which
    # stages the version from object storage first.
    return LoRARequest(
        name=version_name(version), adapter_id=str(version.uid), path=staged_folder(version)
    )


def staged_folder(version) -> str | None:
    return str(version_dir(version)) if is_staged(version) else None


def resolve_model(
    *, tenant, name: str, base_model_name: str, roll: float | None = None, param: str = "model"
) -> ResolvedModel:
    """`base_model_name` is this replica's; `param` is the request field that held `name`,
    for the errors to point at."""
    if name == base_model_name:
        return ResolvedModel(requested=name)
    ref = parse_model_name(name)
    if ref is None:
        raise ModelNotFound(name, param=param)
    try:
        version = adapter_version_resolve(
            tenant=tenant, adapter_name=ref.adapter, alias=ref.alias, number=ref.number, roll=roll
        )
    except Http404:
        if base_model_find(name=name) is not None:  # another replica's base model
            raise _elsewhere(name, name, base_model_name, param) from None
        raise ModelNotFound(name, param=param) from None
    except NotServable as exc:
        raise ModelNotServable(f"The model '{name}' cannot be served: {exc}", param=param) from None
    base = version.adapter.base_model
    if base.name != base_model_name:
        raise _elsewhere(name, base.name, base_model_name, param)
    return ResolvedModel(requested=name, version=version, lora_request=lora_request_for(version))


def _elsewhere(name: str, base: str, ours: str, param: str) -> BaseModelUnavailable:
    return BaseModelUnavailable(
        f"The model '{name}' runs on base model '{base}', which this replica does not serve "
        f"(it serves '{ours}'); send it through the router, which routes each model to its "
        "base model's replicas.",
        param=param,
    )
