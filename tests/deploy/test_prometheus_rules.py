"""deploy/prometheus: the rules pass `promtool check rules` and their unit tests, both Prometheus
configurations pass `promtool check config`, and every series a rule reads is one a real
engine exports (or one the rules record, or Prometheus' own `up`)."""

from __future__ import annotations

import shutil

import pytest
import yaml

from .prometheus_rules import PROMETHEUS, RULE_FILES, recorded, rules
from .promql_names import series_names
from .tools import ROOT, run_promtool

RULES_TEST = ROOT / "tests" / "deploy" / "prometheus" / "loraplex-rules.test.yml"
SCRAPED_BY_PROMETHEUS = {"up"}  # series Prometheus writes for every target


def exported_names(samples: set[str]) -> set[str]:
    """Sample names and the family names a selector may use (histograms' `_bucket` etc.)."""
    return samples | {
        s.rsplit("_", 1)[0] for s in samples if s.endswith(("_bucket", "_sum", "_count"))
    }


def test_the_rule_files_pass_promtool_check_rules():
    assert RULE_FILES
    output = run_promtool("check", "rules", *map(str, RULE_FILES), cwd=PROMETHEUS)
    assert output.count("SUCCESS") == len(RULE_FILES), output


def test_the_alerts_pass_their_promtool_unit_tests():
    output = run_promtool("test", "rules", RULES_TEST.name, cwd=RULES_TEST.parent)
    assert "SUCCESS" in output


@pytest.mark.parametrize("config", ["prometheus.yml", "prometheus-kubernetes.yml"])
def test_the_prometheus_configurations_pass_promtool_check_config(config, tmp_path):
    """Checked whole (rule files included), with the token file they name written beside."""
    shutil.copytree(PROMETHEUS, tmp_path / "prometheus")
    token = tmp_path / "metrics-token"
    token.write_text("a-token\n")
    path = tmp_path / "prometheus" / config
    loaded = yaml.safe_load(path.read_text())
    jobs = {job["job_name"]: job for job in loaded["scrape_configs"]}
    assert set(jobs) == {"loraplex-web", "loraplex-engine"}  # the alerts' job names
    for job in jobs.values():
        assert job["metrics_path"] == "/metrics"
        assert job["authorization"]["type"] == "Bearer"  # /metrics needs the token
        job["authorization"]["credentials_file"] = str(token)
    assert sorted(loaded["rule_files"]) == [f"rules/{p.name}" for p in RULE_FILES]
    path.write_text(yaml.safe_dump(loaded))
    output = run_promtool("check", "config", config, cwd=path.parent)
    assert "SUCCESS" in output and "FAILED" not in output, output


def test_every_series_a_rule_reads_is_exported_or_recorded(exported_samples):
    known = exported_names(exported_samples) | recorded() | SCRAPED_BY_PROMETHEUS
    for rule in rules():
        unknown = series_names(rule["expr"]) - known
        assert not unknown, f"{rule.get('record') or rule['alert']} reads {sorted(unknown)}"


def test_the_engine_exports_the_families_the_figures_need(exported_samples):
    """Each figure the README tells operators to watch, from the engine's own series."""
    for name in (
        "loraplex_lora_hits_total",
        "loraplex_lora_lookups_total",
        "loraplex_lora_swap_in_seconds_bucket",
        "loraplex_lora_load_seconds_bucket",
        "loraplex_lora_load_failures_total",
        "loraplex_time_to_first_token_seconds_bucket",
        "loraplex_kv_cache_blocks_used",
        "loraplex_lora_slots_used",
    ):
        assert name in exported_samples, name


def test_the_name_check_catches_a_misspelt_series():
    assert series_names(
        'sum by (tier) (rate(loraplex_lora_hit_total{tier="device"}[5m])) / on (tier) x:y offset 1h'
    ) == {"loraplex_lora_hit_total", "x:y"}
    assert series_names("histogram_quantile(0.99, sum by (le) (rate(a_bucket[5m]))) > 0.01") == {
        "a_bucket"
    }


def test_a_broken_rule_fails_promtool(tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text(
        yaml.safe_dump({"groups": [{"name": "g", "rules": [{"record": "a:b", "expr": "sum(("}]}]})
    )
    with pytest.raises(AssertionError, match="parse error"):
        run_promtool("check", "rules", str(broken), cwd=tmp_path)


def test_every_alert_says_what_to_do():
    alerts = [rule for rule in rules() if "alert" in rule]
    assert {a["alert"] for a in alerts} == {
        "LoraplexAdapterHitRateFalling",
        "LoraplexSwapInSlow",
        "LoraplexAdapterLoadFailures",
        "LoraplexReplicaDown",
        "LoraplexEngineNotReady",
    }
    for alert in alerts:
        assert alert["labels"]["severity"] in {"warning", "critical"}
        assert alert["annotations"]["summary"] and alert["annotations"]["description"]


def test_the_swap_in_alert_fires_over_ten_milliseconds():
    (swap,) = [r for r in rules() if r.get("alert") == "LoraplexSwapInSlow"]
    assert swap["expr"].strip() == "loraplex:lora_swap_in_seconds:p99_5m > 0.010"
