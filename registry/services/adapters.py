"""Adapters: a tenant's named slot for versions of one fine-tune of one base model."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import transaction

from audit.services import Subject, audit_record, snapshot

from .. import objectstore, staging
from ..errors import (
    AdapterExists,
    AdapterInUse,
    InvalidName,
    NameTaken,
    NoBaseModel,
    UnknownBaseModel,
)
from ..models import Adapter, BaseModel
from ..names import adapter_name_validator


def _audit(adapter: Adapter, verb: str, *, actor: str, before=None, after=None) -> None:
    subject = Subject(tenant=adapter.tenant, type="adapter", name=adapter.name)
    audit_record(subject=subject, actor=actor, verb=verb, before=before, after=after)


def _snapshot(adapter: Adapter) -> dict:
    return snapshot(adapter, "name", "description", base_model=adapter.base_model.name)


def _base_model(name: str | None) -> BaseModel:
    if name is None:
        default = BaseModel.objects.filter(is_default=True).first()
        if default is None:
            raise NoBaseModel(
                "no base model is imported yet; an operator must run `manage.py import_base_model`",
            )
        return default
    found = BaseModel.objects.filter(name=name).first()
    if found is None:
        known = ", ".join(BaseModel.objects.values_list("name", flat=True)) or "none"
        raise UnknownBaseModel(
            f"no base model named {name!r}; known: {known}",
            param="base_model",
        )
    return found


@transaction.atomic
def adapter_create(
    *, tenant, name: str, actor: str, base_model_name: str | None = None, description: str = ""
) -> Adapter:
    """A new adapter on the named base model (default: the default base model)."""
    try:
        adapter_name_validator(name)
    except ValidationError as exc:
        raise InvalidName(exc.messages[0], param="name") from None
    base_model = _base_model(base_model_name)
    if BaseModel.objects.filter(name=name).exists():
        raise NameTaken(
            f"'{name}' is a base model's name; an adapter may not shadow it in model strings",
            param="name",
        )
    if Adapter.objects.filter(tenant=tenant, name=name).exists():
        raise AdapterExists(f"an adapter named '{name}' already exists")
    adapter = Adapter(
        tenant=tenant, name=name, base_model=base_model, description=description, created_by=actor
    )
    adapter.full_clean()
    adapter.save()
    _audit(adapter, "adapter.create", actor=actor, after=_snapshot(adapter))
    return adapter


@transaction.atomic
def adapter_update(*, adapter: Adapter, actor: str, description: str) -> Adapter:
    """Only the description changes; the name and base model are what versions were built on."""
    before = _snapshot(adapter)
    adapter.description = description
    adapter.full_clean()
    adapter.save(update_fields=["description", "updated_at"])
    _audit(adapter, "adapter.update", actor=actor, before=before, after=_snapshot(adapter))
    return adapter


@transaction.atomic
def adapter_delete(*, adapter: Adapter, actor: str, force: bool = False) -> None:
    """Delete an adapter, its versions and their stored objects.

    Refused while an alias points at one of its versions (traffic may be flowing), unless
    forced. Objects go after the commit, so a failed delete never loses bytes a row needs.
    """
    adapter = Adapter.objects.select_for_update().get(pk=adapter.pk)
    aliases = list(adapter.aliases.select_related("version"))
    if aliases and not force:
        named = ", ".join(f"{a.name} -> v{a.version.number}" for a in aliases)
        raise AdapterInUse(
            f"adapter '{adapter.name}' is in use by aliases {named}; delete those aliases "
            "first, or delete with force=true",
        )
    versions = list(adapter.versions.all())
    keys = [k for v in versions for k in (v.config_key, v.weights_key)]
    keys += list(adapter.eval_sets.values_list("key", flat=True))
    before = _snapshot(adapter) | {
        "versions": [v.number for v in versions],
        "aliases": {a.name: a.version.number for a in aliases},
    }
    _audit(adapter, "adapter.delete", actor=actor, before=before)
    adapter.aliases.all().delete()
    adapter.delete()

    def cleanup():
        objectstore.delete_quietly(keys)
        for version in versions:
            staging.unstage(version)

    transaction.on_commit(cleanup)
