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
from dataclasses import dataclass

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
    scan = _Scan(key)
    try:
        i = 0
        while i < len(key):
            i = scan.token(i)
    except _Refused as e:
        return str(e)
    if len(scan.groups) > 1:
        return "has an unclosed '('"
    if scan.quantifiers > MAX_QUANTIFIERS:
        return f"has {scan.quantifiers} repeating quantifiers; at most {MAX_QUANTIFIERS}"
    return None


class _Refused(Exception):
    """A construct the scan refuses; the message says which."""


@dataclass
class _Group:
    """What an open group holds so far; repeating the group repeats these too."""

    quantifier: bool = False
    alternation: bool = False


class _Scan:
    """One pass over a pattern: the open groups, and the group just closed when the last
    atom was one (a quantifier right after it repeats the whole group)."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.groups = [_Group()]  # the pattern itself is the outermost
        self.closed: _Group | None = None
        self.quantifiers = 0

    def token(self, i: int) -> int:
        """Read the token at `i`; the index after it."""
        ch = self.key[i]
        closed, self.closed = self.closed, None
        if ch == "\\":
            if self.key[i + 1 : i + 2].isdigit():
                raise _Refused("uses a backreference")
            return i + 2
        if ch == "[":
            end = _class_end(self.key, i)
            if end is None:
                raise _Refused("has an unclosed character class")
            return end + 1
        if ch == "(":
            return self._open(i)
        if ch == ")":
            return self._close(i)
        if ch == "|":
            self.groups[-1].alternation = True
            return i + 1
        if ch in "*+?{":
            return self._quantifier(i, closed)
        return i + 1

    def _open(self, i: int) -> int:
        if self.key.startswith("(?", i) and not self.key.startswith("(?:", i):
            raise _Refused("uses a lookaround, inline flag or named group; plain groups only")
        self.groups.append(_Group())
        return i + 3 if self.key.startswith("(?:", i) else i + 1

    def _close(self, i: int) -> int:
        if len(self.groups) == 1:
            raise _Refused("has an unbalanced ')'")
        inner = self.groups.pop()
        self.groups[-1].quantifier |= inner.quantifier
        self.groups[-1].alternation |= inner.alternation
        self.closed = inner
        return i + 1

    def _quantifier(self, i: int, closed: _Group | None) -> int:
        end = _quantifier_end(self.key, i)
        if end is None:  # a literal '{'
            return i + 1
        unbounded = _repeats_many(self.key[i:end])
        if unbounded and closed is not None and (closed.quantifier or closed.alternation):
            raise _Refused("repeats a group that holds a quantifier or an alternation")
        if unbounded:
            self.quantifiers += 1
            self.groups[-1].quantifier = True
        if self.key[end : end + 1] in ("?", "+"):  # lazy or possessive
            end += 1
        return end


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
