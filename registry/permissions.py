"""Staff permissions beyond Django's add/change/delete/view, declared in the models' Meta.

`operate_engines` (on BaseModel: the engines serve it) lets a staff user load, pin and unpin
adapters on the engines and see the Engines page; being staff alone does not.
"""

OPERATE_ENGINES_CODENAME = "operate_engines"
OPERATE_ENGINES = f"registry.{OPERATE_ENGINES_CODENAME}"


def can_operate_engines(user) -> bool:
    return bool(
        user is not None
        and user.is_authenticated
        and user.is_staff
        and user.has_perm(OPERATE_ENGINES)
    )
