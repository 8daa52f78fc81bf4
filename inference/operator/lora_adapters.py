"""The engine's side of the operator protocol (inference/operator_protocol.py), for operators
only: the operator token, or a staff session with the `registry.operate_engines` permission.

`lora_name` names a registry version as `<tenant>/<adapter>[@alias|:n]`
(registry/model_names.py), so an operator warms exactly what tenants' requests will resolve
to; loading also pins it (popular adapters stay hot), unpinning lets the LRU evict it again.

A load with vLLM's `lora_path` (a folder or `s3://` prefix) first registers those files as
the next version of `<tenant>/<adapter>` (registry/services/registrations.py: the upload's
validation and quality gate), then loads and pins that version, unpinning the adapter's
other versions here: the name now serves those files, as vLLM's in-place reload would.
The answer comes once the version may serve, or with the validation report.
"""

import hmac
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import JsonResponse

from platform_site.error_responses import error_body
from platform_site.errors import ApiError
from registry.errors import NotServable
from registry.model_names import ModelRef, parse_qualified_name, version_name
from registry.models import AdapterVersion
from registry.permissions import OPERATE_ENGINES, can_operate_engines
from registry.services.lora_sources import LoraSource, configured_roots, parse_lora_source
from registry.services.registrations import (
    AdapterRejected,
    Registration,
    adapter_version_register,
    version_await_servable,
)
from tenants.keyauth import bearer_token
from tenants.models import Tenant

from .auth import require_csrf
from .engine_host import HOST
from .errors import ModelNotFound, ModelNotServable, OperatorOnly, ProtocolError, UnknownParameter
from .openai_protocol import load_json
from .operator_protocol import LOAD, LOAD_FIELDS, LOAD_INPLACE, LORA_NAME, LORA_PATH, NAME_FIELDS
from .resolution import lora_request_for, resolve_model

TOKEN_ACTOR = "operator"  # who the audit trail says registered a version with the token

# What the listing shows of each adapter; not where its files sit on the engine's disk.
LISTED_FIELDS = (
    "name",
    "adapter_id",
    "tier",
    "slot",
    "pinned",
    "loading",
    "rank",
    "running",
    "waiting",
)

# A registration's errors name the upload's parts and the import's source; here, these fields.
_FIELD_OF = {"source": LORA_PATH, "config": LORA_PATH, "weights": LORA_PATH, "name": LORA_NAME}


def authorize(request) -> str:
    """Who is operating, for the audit trail. A session (no Authorization header) needs the
    permission and, to change anything, the page's CSRF token: a staff member's browser must
    not be driven by another site."""
    header = request.META.get("HTTP_AUTHORIZATION")
    user = getattr(request, "user", None)
    if not header and user is not None and user.is_authenticated:
        if not can_operate_engines(user):
            raise OperatorOnly(f"Operator endpoints need the {OPERATE_ENGINES} permission.")
        require_csrf(request)
        return f"admin:{user.get_username()}"
    given = bearer_token(header)
    token = settings.OPERATOR_TOKEN
    if not token or not hmac.compare_digest(given.encode(), token.encode()):
        raise OperatorOnly(
            "Operator endpoints need the operator token, or a staff session with the "
            f"{OPERATE_ENGINES} permission."
        )
    return TOKEN_ACTOR


# ---------------------------------------------------------------- the request body


@dataclass(frozen=True)
class OperatorCall:
    lora_name: object  # checked where it is resolved
    lora_path: str | None = None
    load_inplace: bool = False


def parse_call(raw: bytes, *, action: str) -> OperatorCall:
    """The body, strictly: a field the action does not take is refused, never ignored."""
    body = load_json(raw)
    fields = LOAD_FIELDS if action == LOAD else NAME_FIELDS
    unknown = [name for name in body if name not in fields]
    if unknown:
        names = ", ".join(f"'{name}'" for name in unknown)
        raise UnknownParameter(
            f"Unknown field {names}: {action} takes {', '.join(fields)}.", param=unknown[0]
        )
    path, inplace = body.get(LORA_PATH), body.get(LOAD_INPLACE, False)
    if path is not None and not isinstance(path, str):
        raise ProtocolError(
            f"{LORA_PATH} must be a string: a folder or s3://bucket/prefix/.", param=LORA_PATH
        )
    if not isinstance(inplace, bool):
        raise ProtocolError(f"{LOAD_INPLACE} must be true or false.", param=LOAD_INPLACE)
    if inplace and path is None:
        raise ProtocolError(
            f"{LOAD_INPLACE} applies to a load with {LORA_PATH} (new files for a name).",
            param=LOAD_INPLACE,
        )
    return OperatorCall(body.get(LORA_NAME), path, inplace)


# ---------------------------------------------------------------- registered versions by name


def resolve_operator_name(lora_name) -> object:
    """`tenant/adapter[@alias|:n]` -> a LoRARequest for that version."""
    ref = parse_qualified_name(lora_name)
    if ref is None:
        raise ProtocolError(
            f"{LORA_NAME} must read '<tenant>/<adapter>[@alias|:n]'.", param=LORA_NAME
        )
    tenant = Tenant.objects.filter(slug=ref.tenant).first()
    if tenant is None:
        raise ModelNotFound(lora_name, param=LORA_NAME)
    assert HOST.model is not None, "callers start the engine first"
    resolved = resolve_model(
        tenant=tenant, name=ref.model, base_model_name=HOST.model.name, roll=1.0, param=LORA_NAME
    )
    if resolved.version is None:
        raise ProtocolError("That is the base model; it is always loaded.", param=LORA_NAME)
    return resolved.lora_request


async def _engine():
    return HOST.engine or await sync_to_async(HOST.start, thread_sensitive=False)()


async def _engine_and_adapter(lora_name):
    engine = await _engine()
    return engine, await sync_to_async(resolve_operator_name)(lora_name)


# ---------------------------------------------------------------- files registered from a path


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
    tenant = Tenant.objects.filter(slug=ref.tenant).first()
    if tenant is None:
        raise ModelNotFound(str(ref), param=LORA_NAME)
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


def await_servable(version: AdapterVersion, *, timeout: float):
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


def rejection_response(exc: AdapterRejected) -> JsonResponse:
    """The error answer, with the version the files became and its report (every check)."""
    body = error_body(exc)
    body["error"].update(exc.details)
    return JsonResponse(body, status=exc.status)


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


# ---------------------------------------------------------------- the actions


async def load(call: OperatorCall, actor: str) -> dict:
    """Load and pin: it stays hot until unpinned. With `lora_path`, the files first."""
    if call.lora_path is None:
        engine, lora = await _engine_and_adapter(call.lora_name)
        await engine.load_lora(lora, pin=True)
        return {}
    adapter_target(call.lora_name)  # a bad name is refused before any file is looked at
    source = await sync_to_async(source_of)(call.lora_path)
    engine = await _engine()
    registration, lora = await sync_to_async(register_and_await)(call, source, actor=actor)
    await load_version(engine, lora)
    return {"version": lora.name, "created": registration.created}


async def unload(call: OperatorCall, actor: str) -> dict:
    engine, lora = await _engine_and_adapter(call.lora_name)
    await engine.unload_lora(lora.adapter_id)
    return {}


async def set_pinned(call: OperatorCall, actor: str, *, pinned: bool) -> dict:
    """Pinning an adapter the engine has not loaded yet loads it (the admin pins versions
    before their first request); unpinning one it does not hold is a 400 from the engine."""
    engine, lora = await _engine_and_adapter(call.lora_name)
    if pinned:
        await engine.load_lora(lora, pin=True)
    else:
        await engine.pin_lora(lora.adapter_id, pinned=False)
    return {}


async def list_adapters() -> list[dict]:
    engine = HOST.engine
    loaded = [] if engine is None else await engine.list_loras()
    return [{k: v for k, v in adapter.items() if k in LISTED_FIELDS} for adapter in loaded]
