"""roles/prometheus: what the global tier keeps of the shards' own /metrics.

The prometheus_shards job keeps a list of metric families; everything gpufleet reads
from it (the Prometheus alert rules the global tier evaluates, the monitoring-health
dashboard) must pass it, and the bulky families must not.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from ansible.plugins.loader import filter_loader
from render_role import ROLES, ROOT, example_inventory, render

filter_loader.add_directory(str(ROOT / "plugins" / "filter"))

RULES = ROLES / "prometheus" / "files" / "rules" / "gpufleet-prometheus.rules.yml"
DASHBOARD = ROLES / "grafana" / "files" / "dashboards" / "monitoring-health.json"
# A metric name read from a Prometheus' own /metrics.
OWN_METRIC = re.compile(r"\b(?:prometheus|process)_[a-z_]+\b")
INSTANCES = {
    "global": {"name": "global", "mode": "global", "shard": None, "replica": 0},
    "shard": {"name": "shard-0", "mode": "shard", "shard": 0, "replica": 0},
}


def config(mode: str) -> dict:
    groups, _ = example_inventory()
    host = groups["prometheus_global" if mode == "global" else "prometheus"][0]
    return yaml.safe_load(
        render("prometheus", "prometheus.yml.j2", host, {"_instance": INSTANCES[mode]})
    )


def kept() -> re.Pattern:
    (job,) = [j for j in config("global")["scrape_configs"] if j["job_name"] == "prometheus_shards"]
    (rule,) = job["metric_relabel_configs"]
    assert rule["action"] == "keep" and rule["source_labels"] == ["__name__"]
    # Prometheus anchors relabel regexes at both ends.
    return re.compile(f"^(?:{rule['regex']})$")


def own_metrics_read_by_gpufleet() -> set[str]:
    rules = yaml.safe_load(RULES.read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    panels = json.loads(DASHBOARD.read_text())
    exprs += re.findall(r'"expr":\s*"((?:[^"\\]|\\.)*)"', json.dumps(panels))
    return {name for expr in exprs for name in OWN_METRIC.findall(expr)}


def test_everything_the_rules_and_the_dashboard_read_is_kept():
    names = own_metrics_read_by_gpufleet()
    assert {"prometheus_config_last_reload_successful", "prometheus_tsdb_head_series"} <= names
    keep = kept()
    dropped = sorted(n for n in names if not keep.match(n))
    assert not dropped, f"read by gpufleet but dropped by the prometheus_shards job: {dropped}"


@pytest.mark.parametrize(
    "name",
    [
        "prometheus_http_request_duration_seconds_bucket",
        "prometheus_http_response_size_bytes_bucket",
        "prometheus_engine_query_duration_seconds",
        "prometheus_sd_discovered_targets",
        "go_gc_duration_seconds",
        "net_conntrack_dialer_conn_attempted_total",
    ],
)
def test_bulky_families_are_dropped(name):
    assert not kept().match(name)


def test_only_the_global_tier_scrapes_the_shards():
    jobs = [j["job_name"] for j in config("shard")["scrape_configs"]]
    assert "prometheus_shards" not in jobs and "federate" not in jobs


@pytest.mark.skipif(not shutil.which("promtool"), reason="promtool not installed")
def test_the_global_config_passes_promtool(tmp_path: Path):
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config("global")))
    result = subprocess.run(
        ["promtool", "check", "config", "--syntax-only", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
