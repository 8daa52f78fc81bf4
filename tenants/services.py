"""Changes to tenants, memberships and API keys. Views and commands call these; nothing else
writes."""

from collections.abc import Collection
from datetime import datetime, timedelta

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from audit.services import Subject, audit_record, snapshot

from . import keys
from .errors import ScopeNotHeld
from .models import ApiKey, Membership, Tenant
from .scopes import OWNER, ROLE_CHOICES, parse_scopes

LAST_USED_RESOLUTION = timedelta(minutes=1)


@transaction.atomic
def tenant_create(*, slug: str, name: str = "", owner=None) -> Tenant:
    tenant = Tenant(slug=slug, name=name or slug)
    tenant.full_clean()
    tenant.save()
    if owner is not None:
        membership_set(tenant=tenant, user=owner, role=OWNER)
    return tenant


def tenant_set_active(*, tenant: Tenant, active: bool) -> Tenant:
    """Suspending a tenant stops its keys and members at once (checked on every request)."""
    tenant.is_active = active
    tenant.save(update_fields=["is_active"])
    return tenant


def membership_set(*, tenant: Tenant, user, role: str) -> Membership:
    if role not in dict(ROLE_CHOICES):
        raise ValidationError({"role": f"Unknown role {role!r}."})
    membership, _ = Membership.objects.update_or_create(
        tenant=tenant, user=user, defaults={"role": role}
    )
    return membership


def user_get_or_create(*, email: str, password: str | None = None):
    User = get_user_model()
    user, created = User.objects.get_or_create(username=email, defaults={"email": email})
    if created or password:
        if password:
            user.set_password(password)
        else:
            user.set_unusable_password()
        user.save()
    return user


def _actor(actor: str | None, user=None) -> str:
    """How the audit trail names who acted: the principal's label, else the user, else "system"."""
    if actor:
        return actor
    return f"user:{user.get_username()}" if user is not None else "system"


def _audit(api_key: ApiKey, verb: str, *, actor: str, before=None, after=None) -> None:
    name = f"{api_key.name} (lpx_{api_key.prefix})"
    subject = Subject(tenant=api_key.tenant, type="api_key", name=name)
    audit_record(subject=subject, actor=actor, verb=verb, before=before, after=after)


def _key_snapshot(api_key: ApiKey) -> dict:
    return snapshot(api_key, "name", "prefix", "scopes", "expires_at", "revoked_at")


@transaction.atomic
def api_key_create(
    *,
    tenant: Tenant,
    name: str,
    scopes,
    created_by=None,
    expires_at: datetime | None = None,
    actor: str | None = None,
    grantable: Collection[str] | None = None,
) -> tuple[ApiKey, str]:
    """Create a key and return it with its full text, which exists only in this return value.

    `grantable`: the scopes the caller holds (its key's, or its role's), the most the new key
    may carry; None only for operators' own tools (manage.py commands).
    """
    if expires_at is not None and expires_at <= timezone.now():
        raise ValidationError({"expires_at": "The expiry must be in the future."})
    try:
        scope_list = parse_scopes(scopes)
    except ValueError as exc:
        raise ValidationError({"scopes": str(exc)}) from exc
    beyond = sorted(set(scope_list) - set(grantable)) if grantable is not None else []
    if beyond:
        raise ScopeNotHeld(f"You can grant only scopes you hold; you lack {', '.join(beyond)}.")
    new = keys.generate_key()
    api_key = ApiKey(
        tenant=tenant,
        name=name,
        prefix=new.prefix,
        hashed_key=keys.hash_key(new.full),
        scopes=scope_list,
        created_by=created_by,
        expires_at=expires_at,
    )
    api_key.full_clean()
    api_key.save()
    _audit(api_key, "api_key.create", actor=_actor(actor, created_by), after=_key_snapshot(api_key))
    return api_key, new.full


@transaction.atomic
def api_key_revoke(*, api_key: ApiKey, actor: str | None = None) -> ApiKey:
    """Idempotent: revoking twice keeps the first revocation time (and one audit event)."""
    if api_key.revoked_at is None:
        before = _key_snapshot(api_key)
        api_key.revoked_at = timezone.now()
        api_key.save(update_fields=["revoked_at"])
        after = _key_snapshot(api_key)
        _audit(api_key, "api_key.revoke", actor=_actor(actor), before=before, after=after)
    return api_key


def api_key_touch_due(api_key: ApiKey, now: datetime) -> bool:
    return api_key.last_used_at is None or now - api_key.last_used_at >= LAST_USED_RESOLUTION


def api_key_touch(*, api_key: ApiKey, now: datetime | None = None) -> None:
    """Record use at most once a minute, so hot keys don't turn every request into a write."""
    now = now or timezone.now()
    if api_key_touch_due(api_key, now):
        ApiKey.objects.filter(pk=api_key.pk).update(last_used_at=now)
        api_key.last_used_at = now
