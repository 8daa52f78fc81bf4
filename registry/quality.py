"""The quality gate: the verdict on one evaluation's figures, and the words that explain it.

No queries here, so the rule reads in one place: an evaluation passes iff the adapter's
perplexity is at most LORAPLEX_EVAL_MAX_PPL_RATIO (1.10) times its first evaluation's (which
records it, so passes), and, when LORAPLEX_EVAL_MAX_BASE_RATIO is set, at most that times the
base model's alone on the same rows. A base upgrade is judged against the first figure, so
quality cannot drift down one revision at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

DEFAULT_MAX_PPL_RATIO = 1.10


def short_revision(revision: str) -> str:
    return f"{revision[:12]}…" if revision else "(none)"


def figure(value: float | None) -> str:
    """A perplexity as people read it: 4 significant digits (14.2, 9.123, 1.234e+05)."""
    return "?" if value is None else f"{value:.4g}"


@dataclass(frozen=True)
class Verdict:
    passed: bool
    reason: str  # a sentence: which figure, against what, by how much
    ratio: float | None  # adapter / reference (None: no reference yet)
    base_ratio: float | None  # adapter / base model alone


def factors() -> tuple[float, float | None]:
    """(max ratio to the reference, max ratio to the base model or None when off)."""
    max_ratio = getattr(settings, "EVAL_MAX_PPL_RATIO", DEFAULT_MAX_PPL_RATIO)
    return float(max_ratio), getattr(settings, "EVAL_MAX_BASE_RATIO", None)


def verdict(
    *,
    perplexity: float,
    base_perplexity: float,
    reference: float | None,
    revision: str,
    max_ratio: float,
    max_base_ratio: float | None,
) -> Verdict:
    """Passed or degraded, for an adapter `perplexity` on revision `revision`.

    `reference` is the version's first figure; None means this is its first evaluation: it
    becomes the reference and passes that check. `max_base_ratio` None: that check is off.
    The factors are usually `factors()`, the settings.
    """
    where = f"on revision {short_revision(revision)}"
    base_ratio = _divide(perplexity, base_perplexity)
    base_alone = f"base model alone {figure(base_perplexity)}"
    ratio: float | None = None
    if reference is None:
        compared = f"its first evaluation, now its reference; {base_alone}"
    else:
        ratio = _divide(perplexity, reference)
        against = f"vs {figure(reference)} at its first evaluation ({ratio_text(ratio, max_ratio)})"
        if not perplexity <= reference * max_ratio:
            reason = f"degraded {where}: perplexity {figure(perplexity)} {against}"
            return Verdict(False, reason, ratio, base_ratio)
        compared = f"{against}; {base_alone}"
    if max_base_ratio is not None and not perplexity <= base_perplexity * max_base_ratio:
        reason = (
            f"degraded {where}: perplexity {figure(perplexity)} vs {figure(base_perplexity)} "
            f"for the base model alone ({ratio_text(base_ratio, max_base_ratio)})"
        )
        return Verdict(False, reason, ratio, base_ratio)
    reason = f"passed {where}: perplexity {figure(perplexity)}, {compared}"
    return Verdict(True, reason, ratio, base_ratio)


def ratio_text(ratio: float, limit: float) -> str:
    """`x1.56 > x1.10`: the ratio and its limit with enough decimals to tell them apart."""
    sign = "<=" if ratio <= limit else ">"
    for digits in range(2, 7):
        shown, bound = f"{ratio:.{digits}f}", f"{limit:.{digits}f}"
        if (shown != bound) or ratio == limit:
            break
    return f"x{shown} {sign} x{bound}"


def _divide(value: float, by: float) -> float:
    return value / by if by else float("inf")


def why_not_passed(version, base_revision: str) -> str | None:
    """Why the version's quality keeps it from serving on `base_revision`; None if it may."""
    quality = version.quality
    if quality in version.SERVABLE_QUALITY and version.quality_revision == base_revision:
        return None
    where = f"on revision {short_revision(base_revision)}"
    if version.quality_revision != base_revision or quality == version.Quality.UNEVALUATED:
        return f"not evaluated {where} yet"
    if quality == version.Quality.PENDING:  # its detail says what it waits for, if it does
        return version.quality_detail or f"evaluation pending {where}"
    return version.quality_detail or f"evaluation {quality} {where}"
