"""The series a PromQL expression reads, without a PromQL parser: label matchers, label lists
(by, on, ...), ranges, strings and numbers removed, what is left that is not a function or a
keyword is a metric name. Enough for the expressions in deploy/, which a test keeps that way."""

from __future__ import annotations

import re

KEYWORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "offset", "bool", "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk",
    "bottomk", "quantile", "count_values", "group", "inf", "nan",
}  # fmt: skip

_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^}]*\}")
_LABEL_LISTS = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_RANGES = re.compile(r"\[[^\]]*\]")
_OFFSETS = re.compile(r"\boffset\s+\d+[smhdwy]")
_NAME = re.compile(r"(?<![\w:.])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?")


def series_names(expr: str) -> set[str]:
    text = _STRINGS.sub(" ", expr)
    text = _MATCHERS.sub(" ", text)
    text = _LABEL_LISTS.sub(" ", text)
    text = _RANGES.sub(" ", text)
    text = _OFFSETS.sub(" ", text)
    names = set()
    for match in _NAME.finditer(text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in KEYWORDS:
            continue  # a function, an aggregation or an operator
        names.add(name)
    return names
