"""Production refuses to start with secrets anyone could guess, or with debug pages on.

A deployment check (`manage.py check --deploy`; `manage.py serve` runs it in production):
each secret must be set, at least 32 characters long, not a placeholder of .env.example, and
the metrics token, which Prometheus' configuration holds, must not double as another secret.
"""

from django.conf import settings
from django.core.checks import Error, Tags, register

MIN_SECRET_LENGTH = 32
# The values .env.example ships with (tests/platform/test_checks.py keeps them in step); any
# value that still says "change-me" is one too.
PLACEHOLDER_MARK = "change-me"

GENERATE = 'Generate one: python -c "import secrets; print(secrets.token_urlsafe(48))"'
# variable -> the setting that holds it
SECRETS = {
    "SECRET_KEY": "SECRET_KEY",
    "LORAPLEX_API_KEY_SECRET": "API_KEY_HMAC_SECRET",
    "LORAPLEX_OPERATOR_TOKEN": "OPERATOR_TOKEN",
    "LORAPLEX_METRICS_TOKEN": "METRICS_TOKEN",
}


def secret_problem(value: str) -> str | None:
    """Why a secret is unfit for production, or None."""
    if not value:
        return "is not set"
    if PLACEHOLDER_MARK in value.lower():
        return "is still the placeholder from .env.example"
    if len(value) < MIN_SECRET_LENGTH:
        return f"is {len(value)} characters long; use at least {MIN_SECRET_LENGTH} random ones"
    return None


@register(Tags.security, deploy=True)
def production_secrets(app_configs, **kwargs) -> list[Error]:
    if not settings.PRODUCTION:
        return []
    errors = []
    for i, (variable, name) in enumerate(SECRETS.items(), start=1):
        value = getattr(settings, name)
        if name == "API_KEY_HMAC_SECRET" and value == settings.SECRET_KEY:
            continue  # not set apart: SECRET_KEY's check covers it
        problem = secret_problem(value)
        if problem:
            errors.append(Error(f"{variable} {problem}.", hint=GENERATE, id=f"loraplex.E00{i}"))
    others = {settings.SECRET_KEY, settings.OPERATOR_TOKEN, settings.API_KEY_HMAC_SECRET}
    if settings.METRICS_TOKEN and settings.METRICS_TOKEN in others:
        errors.append(
            Error(
                "LORAPLEX_METRICS_TOKEN repeats another secret; Prometheus' configuration holds "
                "it.",
                hint="Give the metrics token a value of its own.",
                id="loraplex.E005",
            )
        )
    if settings.DEBUG:
        errors.append(
            Error(
                "DEBUG is on in production: error pages would show settings and tracebacks.",
                hint="Unset DEBUG.",
                id="loraplex.E006",
            )
        )
    return errors


@register()
def quality_gate_factors(app_configs, **kwargs) -> list[Error]:
    """The quality gate's factors (registry/quality.py) must let a version pass at all."""
    errors = []
    if not settings.EVAL_MAX_PPL_RATIO >= 1.0:
        errors.append(
            Error(
                f"LORAPLEX_EVAL_MAX_PPL_RATIO is {settings.EVAL_MAX_PPL_RATIO}; a version's "
                "perplexity could not even equal its own first figure.",
                hint="Use 1.0 or more (the default is 1.10).",
                id="loraplex.E010",
            )
        )
    base_ratio = settings.EVAL_MAX_BASE_RATIO
    if base_ratio is not None and not base_ratio > 0:
        errors.append(
            Error(
                f"LORAPLEX_EVAL_MAX_BASE_RATIO is {base_ratio}; it must be above 0, or unset.",
                hint="Unset it to turn the check off, or use e.g. 1.0 (no worse than the base).",
                id="loraplex.E011",
            )
        )
    return errors


# /v1/completions asks for OpenAI's 16 tokens when a request names no max_tokens.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


@register()
def max_tokens_limits(app_configs, **kwargs) -> list[Error]:
    """The max_tokens default and cap (inference/openai/max_tokens.py): 0 turns either off."""
    errors = []
    for variable, value in (
        ("LORAPLEX_DEFAULT_MAX_TOKENS", settings.DEFAULT_MAX_TOKENS),
        ("LORAPLEX_MAX_TOKENS_CAP", settings.MAX_TOKENS_CAP),
    ):
        if value < 0:
            errors.append(
                Error(f"{variable} is {value}.", hint="Use 0 (off) or more.", id="loraplex.E020")
            )
    if 0 < settings.MAX_TOKENS_CAP < COMPLETIONS_DEFAULT_MAX_TOKENS:
        errors.append(
            Error(
                f"LORAPLEX_MAX_TOKENS_CAP is {settings.MAX_TOKENS_CAP}: /v1/completions would "
                f"refuse every request without max_tokens (OpenAI's default is "
                f"{COMPLETIONS_DEFAULT_MAX_TOKENS}).",
                hint=f"Use 0 (no cap) or {COMPLETIONS_DEFAULT_MAX_TOKENS} or more.",
                id="loraplex.E021",
            )
        )
    return errors
