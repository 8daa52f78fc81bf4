"""deploy/grafana's dashboard: well-formed for Grafana's import (unique panel ids inside a 24-column
grid, one Prometheus datasource variable every query uses), and every query reads recorded
series only, so the dashboard moves with the recording rules."""

from __future__ import annotations

import json

import pytest

from .prometheus_rules import recorded
from .promql_names import series_names
from .tools import DEPLOY

DASHBOARD = DEPLOY / "grafana" / "loraplex-dashboard.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def test_the_dashboard_has_the_import_fields(dashboard):
    assert dashboard["uid"] == "loraplex-overview" and dashboard["title"]
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 36
    (variable,) = dashboard["templating"]["list"]
    assert variable["type"] == "datasource" and variable["query"] == "prometheus"
    assert variable["name"] == "datasource"


def test_every_panel_is_placed_once_and_uses_the_datasource_variable(dashboard):
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        assert panel["type"] == "timeseries" and panel["title"] and panel["targets"]
        assert panel["datasource"] == DATASOURCE
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        mine = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        cells |= mine
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(set(ref_ids)) == len(ref_ids)
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE


def test_every_query_reads_recorded_series(dashboard):
    rules = recorded()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            names = series_names(target["expr"])
            assert names and names <= rules, f"{panel['title']}: {target['expr']}"


def test_there_is_a_panel_per_figure(dashboard):
    read = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in series_names(target["expr"])
    }
    assert {
        "loraplex:adapter_cache_hit_rate:ratio_rate5m",
        "loraplex:lora_swap_in_seconds:p50_5m",
        "loraplex:lora_swap_in_seconds:p99_5m",
        "loraplex:lora_load_seconds:p99_5m",
        "loraplex:time_to_first_token_seconds:p99_5m",
        "instance:kv_cache_usage:ratio",
        "instance:lora_slots_used:sum",
    } <= read
