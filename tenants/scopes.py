"""What an API key or a member may do. One place: keys carry scopes, roles imply them."""

INFERENCE = "inference"
REGISTRY_READ = "registry:read"
REGISTRY_WRITE = "registry:write"
KEYS_WRITE = "keys:write"
ALL_SCOPES = (INFERENCE, REGISTRY_READ, REGISTRY_WRITE, KEYS_WRITE)

OWNER, ADMIN, MEMBER = "owner", "admin", "member"
ROLE_CHOICES = [(OWNER, "Owner"), (ADMIN, "Admin"), (MEMBER, "Member")]
SCOPES_BY_ROLE = {
    OWNER: frozenset(ALL_SCOPES),
    ADMIN: frozenset(ALL_SCOPES),
    MEMBER: frozenset({INFERENCE, REGISTRY_READ}),
}


def parse_scopes(value) -> list[str]:
    """Accept "a,b" or ["a", "b"]; refuse unknown names so a typo never grants nothing silently."""
    items = value.split(",") if isinstance(value, str) else list(value or [])
    scopes = sorted({s.strip() for s in items if s and s.strip()})
    unknown = [s for s in scopes if s not in ALL_SCOPES]
    if unknown:
        raise ValueError(f"Unknown scope(s) {', '.join(unknown)}; valid: {', '.join(ALL_SCOPES)}.")
    if not scopes:
        raise ValueError(f"At least one scope is required; valid: {', '.join(ALL_SCOPES)}.")
    return scopes
