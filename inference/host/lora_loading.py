"""Adapters loaded into this process's engine by their registry names, for operators and
for start-up alike.

A name is `<tenant>/<adapter>[@alias|:n]` (registry/model_names.py), so an operator warms
exactly what tenants' requests will resolve to. Files given by path (vLLM's `lora_path`, a
folder or `s3://` prefix) are first registered as the next version of `<tenant>/<adapter>`
(registry/services/registrations.py: the upload's validation and quality gate); loading that
version pins it and unpins the adapter's other versions here: the name now serves those
files, as vLLM's in-place reload would.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from django.conf import settings

from inference.errors import ModelNotFound, ModelNotServable, ProtocolError
from inference.resolution import lora_request_for, resolve_model
from platform_site.errors import ApiError
from platform_site.operator_protocol import LORA_NAME, LORA_PATH
from registry.errors import NotServable
from registry.model_names import ModelRef, parse_qualified_name, version_name
from registry.services.lora_sources import LoraSource, configured_roots, parse_lora_source
from registry.services.registrations import (
    Registration,
    adapter_version_register,
    version_await_servable,
)
from tenants.selectors import tenant_find

from .engine_host import HOST

# A registration's errors name the upload's parts and the import's source; here, these fields.
_FIELD_OF = {"source": LORA_PATH, "config": LORA_PATH, "weights": LORA_PATH, "name": LORA_NAME}


@dataclass(frozen=True)
class OperatorCall:
    """What to load: a name, and optionally the files that become its next version."""

    lora_name: object  # checked where it is resolved
    lora_path: str | None = None
    load_inplace: bool = False


def resolve_operator_name(lora_name) -> object:
    """`tenant/adapter[@alias|:n]` -> a LoRARequest for that version."""
    ref = parse_qualified_name(lora_name)
    if ref is None:
        raise ProtocolError(
            f"{LORA_NAME} must read '<tenant>/<adapter>[@alias|:n]'.", param=LORA_NAME
        )
    tenant = _tenant_of(ref, lora_name)
    resolved = resolve_model(
        tenant=tenant, name=ref.model, base_model_name=HOST.served_name(), roll=1.0, param=LORA_NAME
    )
    if resolved.version is None:
        raise ProtocolError("That is the base model; it is always loaded.", param=LORA_NAME)
    return resolved.lora_request


def _tenant_of(ref: ModelRef, lora_name):
    """The tenant a qualified name names; an unknown one is as unknown as its model."""
    tenant = tenant_find(slug=ref.tenant) if ref.tenant is not None else None
    if tenant is None:
        raise ModelNotFound(lora_name, param=LORA_NAME)
    return tenant


@contextmanager
def operator_fields() -> Iterator[None]:
    """Registry errors point at `lora_path` and `lora_name`, the fields the operator sent."""
    try:
        yield
    except ApiError as exc:
        exc.param = _FIELD_OF.get(exc.param or "", exc.param)
        raise


def adapter_target(lora_name) -> ModelRef:
    """With files, the name is exactly `<tenant>/<adapter>`: they become its next version."""
    ref = parse_qualified_name(lora_name)
    if ref is None or ref.alias is not None or ref.number is not None:
        raise ProtocolError(
            f"With {LORA_PATH}, {LORA_NAME} must read '<tenant>/<adapter>' (the files become "
            "its next version).",
            param=LORA_NAME,
        )
    return ref


def source_of(lora_path: str, *, fenced: bool = True) -> LoraSource:
    """`fenced`: held to LORAPLEX_LORA_PATH_ROOTS (a request); start-up's modules are not."""
    with operator_fields():
        return parse_lora_source(lora_path, roots=configured_roots() if fenced else None)


def register(ref: ModelRef, source: LoraSource, *, actor: str, replace: bool) -> Registration:
    tenant = _tenant_of(ref, str(ref))
    try:
        with operator_fields():
            return adapter_version_register(
                tenant=tenant,
                adapter_name=ref.adapter,
                source=source,
                actor=actor,
                replace=replace,
                base_model_name=HOST.model.name if HOST.model is not None else None,
            )
    except NotServable as exc:  # the adapter is another base model's
        raise ModelNotServable(exc.message, param=LORA_NAME) from None


def await_servable(version, *, timeout: float):
    """The LoRARequest of the version once it may serve (the quality gate's verdict)."""
    try:
        with operator_fields():
            servable = version_await_servable(version, timeout=timeout)
    except NotServable as exc:
        raise ModelNotServable(
            f"The model '{version_name(version)}' cannot be served: {exc.message}",
            param=LORA_NAME,
        ) from None
    return lora_request_for(servable)


def register_and_await(call: OperatorCall, source: LoraSource, *, actor: str):
    registration = register(
        adapter_target(call.lora_name), source, actor=actor, replace=call.load_inplace
    )
    lora = await_servable(registration.version, timeout=settings.LORA_LOAD_WAIT_SECONDS)
    return registration, lora


async def load_version(engine, lora) -> None:
    """Load and pin `lora`; the adapter's other versions pinned here are unpinned (not
    unloaded: requests using them finish, then the LRU may evict them)."""
    await engine.load_lora(lora, pin=True)
    ref = parse_qualified_name(lora.name)
    assert ref is not None, "a LoRARequest is named tenant/adapter:n"
    for loaded in await engine.list_loras():
        other = parse_qualified_name(loaded["name"])
        same_adapter = other is not None and (other.tenant, other.adapter) == (
            ref.tenant,
            ref.adapter,
        )
        if same_adapter and loaded["pinned"] and loaded["adapter_id"] != lora.adapter_id:
            await engine.pin_lora(loaded["adapter_id"], pinned=False)
