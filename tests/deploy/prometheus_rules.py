"""deploy/prometheus's rules, read: each rule, and the series the recording rules write."""

from __future__ import annotations

import yaml

from .tools import DEPLOY

PROMETHEUS = DEPLOY / "prometheus"
RULE_FILES = sorted((PROMETHEUS / "rules").glob("*.yml"))


def rules() -> list[dict]:
    return [
        rule
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
    ]


def recorded() -> set[str]:
    return {rule["record"] for rule in rules() if "record" in rule}
