"""An operator's files registered as a version, and the wait until that version may serve.

Operators name a folder or S3 prefix (lora_sources.py) rather than upload the files, and
the files take exactly the upload's path (`adapter_version_create`: duplicates, quotas,
storage, audit). Validation runs here at once, so the operator's call gets the verdict; the
task it queues finds the version decided, as a redelivered one would. The evaluation stays
the worker's (it scores on the engines): `version_await_servable` waits for its verdict.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction

from registry.model_names import version_name
from tenants.models import Tenant

from ..errors import Conflict, NoBaseModel, NotServable, RegistryError, StorageUnavailable
from ..models import Adapter, AdapterVersion, BaseModel
from ..selectors import adapter_version_resolve, base_model_default
from ..uploads import CONFIG_FIELD, MAX_CONFIG_BYTES, WEIGHTS_FIELD
from .adapters import adapter_create
from .lora_sources import LoraSource, open_lora_source
from .transitions import undecided
from .versions import (
    _digest,
    _duplicate_of,
    adapter_version_create,
    adapter_version_fail,
    adapter_version_validate,
)

POLL_SECONDS = 0.5
Status = AdapterVersion.Status
Quality = AdapterVersion.Quality


class AdapterRejected(RegistryError, status=400, code="adapter_rejected"):
    """The files became a version and validation rejected it: `version` names it, `report`
    holds every check (as the version's page shows them). Nothing of it is served."""

    def __init__(self, version: AdapterVersion):
        message = f"{version_name(version)} was rejected: {version.status_detail}"
        super().__init__(message, param="source")
        self.details = {"version": version_name(version), "report": version.report}


class AdapterAlreadyLoaded(Conflict, status=409, code="adapter_already_loaded"):
    """vLLM's rule: a name that already has other files is replaced only when asked to
    (`load_inplace: true`), which registers the files as its next version."""


@dataclass(frozen=True)
class Registration:
    version: AdapterVersion
    created: bool  # False: these bytes already were this version


def adapter_version_register(
    *,
    tenant: Tenant,
    adapter_name: str,
    source: LoraSource,
    actor: str,
    replace: bool,
    base_model_name: str | None = None,
) -> Registration:
    """Register the files at `source` as a version of the tenant's adapter (created on
    `base_model_name`, the calling engine's, else the default base model, if need be) and
    validate it now.

    Raises AdapterRejected when validation rejects it, AdapterAlreadyLoaded when `replace`
    is false and the adapter's newest version that was not rejected holds other files, and
    what an upload or an import raises (source not found, too large, quotas, storage).
    """
    if base_model_name is None:
        base = base_model_default()
    else:
        base = BaseModel.objects.filter(name=base_model_name).first()
    if base is None:
        raise NoBaseModel("no base model is imported yet; an operator must import one")
    existing = Adapter.objects.filter(tenant=tenant, name=adapter_name).first()
    if existing is not None and existing.base_model_id != base.pk:
        raise NotServable(
            f"{tenant.slug}/{adapter_name} is an adapter of base model "
            f"{existing.base_model.name}, not of {base.name}"
        )
    with open_lora_source(source) as (config, weights):
        if existing is not None and not replace:
            _refuse_other_files(existing, config, weights)
        with transaction.atomic():  # an adapter created for files that fail is not kept
            if existing is None:
                existing = adapter_create(
                    tenant=tenant, name=adapter_name, actor=actor, base_model_name=base.name
                )
            version, created = adapter_version_create(
                adapter=existing,
                config=config,
                weights=weights,
                actor=actor,
                source=AdapterVersion.FROM_OPERATOR,  # the tenant's view: never the host path
                operator_source=str(source),
            )
    if undecided(version):
        version = _validate_now(version)
    if version.status == Status.REJECTED:
        raise AdapterRejected(version)
    return Registration(version, created)


def _refuse_other_files(adapter: Adapter, config, weights) -> None:
    """Unless these are the files of its newest version that was not rejected (the same
    call again), an adapter that has one keeps it."""
    live = adapter.versions.exclude(status=Status.REJECTED).order_by("-number").first()
    if live is None:
        return
    config_digest = _digest(config, CONFIG_FIELD, MAX_CONFIG_BYTES)
    weights_digest = _digest(weights, WEIGHTS_FIELD, settings.MAX_ADAPTER_BYTES)
    same = _duplicate_of(adapter, config_digest.sha256, weights_digest.sha256)
    if same is None or same.pk != live.pk:
        raise AdapterAlreadyLoaded(
            f"{version_name(live)} holds other files; send load_inplace: true to register "
            "these as its next version",
            param="load_inplace",
        )


def _validate_now(version: AdapterVersion) -> AdapterVersion:
    """The validation task's service, run here; its answers as the task records them."""
    try:
        adapter_version_validate(version_id=version.pk)
    except StorageUnavailable:
        raise  # still pending: the queued task retries it
    except Exception as exc:
        adapter_version_fail(version_id=version.pk, exc=exc)
    version.refresh_from_db()
    return version


def _awaiting_verdict(version: AdapterVersion) -> bool:
    """Validation, or the quality gate's evaluation, has yet to decide."""
    return undecided(version) or (
        version.status == Status.READY and version.quality in (Quality.PENDING, Quality.UNEVALUATED)
    )


def version_await_servable(version: AdapterVersion, *, timeout: float) -> AdapterVersion:
    """The version once it may serve; polls until the verdicts are in, at most `timeout` s.

    Raises AdapterRejected, or NotServable saying why (its evaluation degraded or failed,
    or is still pending when the time is up).
    """
    adapter = version.adapter
    deadline = time.monotonic() + timeout
    while True:
        try:
            return adapter_version_resolve(
                tenant=adapter.tenant, adapter_name=adapter.name, number=version.number
            )
        except NotServable as exc:
            version.refresh_from_db()
            if version.status == Status.REJECTED:
                raise AdapterRejected(version) from None
            if not _awaiting_verdict(version):
                raise
            if time.monotonic() >= deadline:
                raise NotServable(
                    f"{exc.message}; still undecided after {timeout:g} s: load it again later "
                    "(the same files name the same version)"
                ) from None
        time.sleep(POLL_SECONDS)
