"""PEFT's `rank_pattern` / `alpha_pattern`: per-module rank and alpha, matched as PEFT does.

PEFT (`peft.utils.other.get_pattern_key`) takes the first key, in the config's order, for
which `re.match(rf"(.*\\.)?({key})$", module_name)` succeeds, where module_name is the
module's path in the base model ("model.layers.3.self_attn.v_proj", "lm_head"); a module no
key matches keeps `r` / `lora_alpha`.

The keys are regular expressions from an uploaded file, run on the registry's workers, so
before one is compiled it must be short and simple: no backreferences or lookarounds, no
quantified group that itself holds a quantifier or an alternation (the shapes that make
Python's backtracking matcher take exponential time), and at most a few quantifiers (each
can multiply the work by the length of a module name, which is short).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping

MAX_PATTERN_ENTRIES = 1024
MAX_PATTERN_CHARS = 200
MAX_QUANTIFIERS = 3


def pattern_problem(key: str) -> str | None:
    """Why a pattern key may not be run; None when it is safe and compiles."""
    if len(key) > MAX_PATTERN_CHARS:
        return f"is {len(key)} characters long; at most {MAX_PATTERN_CHARS}"
    problem = _complexity_problem(key)
    if problem is not None:
        return problem
    try:
        _compiled(key)
    except re.error as e:
        return f"is not a valid regular expression ({e})"
    return None


def first_match(patterns: Mapping[str, object], module_path: str) -> str | None:
    """The key PEFT would pick for a module; every key must have passed `pattern_problem`."""
    for key in patterns:
        if _compiled(key).match(module_path):
            return key
    return None


@functools.lru_cache(maxsize=4096)
def _compiled(key: str) -> re.Pattern[str]:
    return re.compile(rf"(.*\.)?({key})$")


def _complexity_problem(key: str) -> str | None:
    """Scan a pattern for the constructs that make backtracking blow up (see module doc)."""
    # one frame per open group: [holds a quantifier, holds an alternation]
    frames: list[list[bool]] = [[False, False]]
    last_group: list[bool] | None = None  # the group just closed, if the last atom was one
    quantifiers = 0
    i = 0
    while i < len(key):
        ch = key[i]
        atom_group: list[bool] | None = None
        if ch == "\\":
            if key[i + 1 : i + 2].isdigit():
                return "uses a backreference"
            i += 2
        elif ch == "[":
            end = _class_end(key, i)
            if end is None:
                return "has an unclosed character class"
            i = end + 1
        elif ch == "(":
            if key.startswith("(?", i) and not key.startswith("(?:", i):
                return "uses a lookaround, inline flag or named group; plain groups only"
            frames.append([False, False])
            i += 3 if key.startswith("(?:", i) else 1
            last_group = None
            continue
        elif ch == ")":
            if len(frames) == 1:
                return "has an unbalanced ')'"
            atom_group = frames.pop()
            frames[-1][0] |= atom_group[0]  # repeating the outer group repeats these too
            frames[-1][1] |= atom_group[1]
            i += 1
        elif ch == "|":
            frames[-1][1] = True
            i += 1
            last_group = None
            continue
        elif ch in "*+?{":
            end = _quantifier_end(key, i)
            if end is None:  # a literal '{'
                i += 1
            else:
                unbounded = _repeats_many(key[i:end])
                if last_group is not None and unbounded and any(last_group):
                    return "repeats a group that holds a quantifier or an alternation"
                if unbounded:
                    quantifiers += 1
                    frames[-1][0] = True
                if key[end : end + 1] in ("?", "+"):  # lazy or possessive
                    end += 1
                i = end
                last_group = None
                continue
        else:
            i += 1
        last_group = atom_group
    if len(frames) > 1:
        return "has an unclosed '('"
    if quantifiers > MAX_QUANTIFIERS:
        return f"has {quantifiers} repeating quantifiers; at most {MAX_QUANTIFIERS}"
    return None


def _class_end(key: str, start: int) -> int | None:
    """Index of the ']' closing the character class opened at `start`."""
    i = start + 1
    if key[i : i + 1] == "^":
        i += 1
    if key[i : i + 1] == "]":  # a leading ']' is literal
        i += 1
    while i < len(key):
        if key[i] == "\\":
            i += 2
        elif key[i] == "]":
            return i
        else:
            i += 1
    return None


_BRACES = re.compile(r"\{(\d{0,4})(,(\d{0,4}))?\}")


def _quantifier_end(key: str, i: int) -> int | None:
    if key[i] != "{":
        return i + 1
    m = _BRACES.match(key, i)
    return m.end() if m and (m[1] or m[3]) else None


def _repeats_many(quantifier: str) -> bool:
    """Whether a quantifier lets its atom repeat more than once ('?' and {0,1} do not)."""
    if quantifier in ("*", "+"):
        return True
    if quantifier == "?":
        return False
    m = _BRACES.fullmatch(quantifier)
    assert m is not None
    if m[2] is None:  # {n}
        return int(m[1]) > 1
    return m[3] == "" or int(m[3]) > 1
