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
from render_role import ROLES, ROOT, example_inventory, render, template_value

filter_loader.add_directory(str(ROOT / "plugins" / "filter"))

RULES = ROLES / "prometheus" / "files" / "rules" / "gpufleet-prometheus.rules.yml"
DASHBOARD = ROLES / "grafana" / "files" / "dashboards" / "monitoring-health.json"
# A metric name read from a Prometheus' own /metrics.
OWN_METRIC = re.compile(r"\b(?:prometheus|process)_[a-z_]+\b")
INSTANCES = {
    "global": {"name": "global", "mode": "global", "shard": None, "replica": 0},
    "shard": {"name": "shard-0", "mode": "shard", "shard": 0, "replica": 0},
    "shard-1": {"name": "shard-1", "mode": "shard", "shard": 1, "replica": 1},
    "standalone": {"name": "standalone", "mode": "standalone", "shard": None, "replica": 0},
}


def config(mode: str, overrides: dict | None = None) -> dict:
    groups, _ = example_inventory()
    host = groups["prometheus_global" if mode == "global" else "prometheus"][0]
    return yaml.safe_load(
        render(
            "prometheus",
            "prometheus.yml.j2",
            host,
            {"_instance": INSTANCES[mode], **(overrides or {})},
        )
    )


def slurm_job(mode: str, overrides: dict | None = None) -> dict | None:
    jobs = [j for j in config(mode, overrides)["scrape_configs"] if j["job_name"] == "slurm"]
    return jobs[0] if jobs else None


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


# --- the Slurm exporter: each shard asks for its own nodes' series ---------------------


def test_each_shard_asks_the_slurm_exporter_for_its_own_nodes():
    shard0, shard1 = slurm_job("shard"), slurm_job("shard-1")
    # The lowest shard also gets the cluster-level series; exactly one shard does.
    assert shard0["params"] == {"shard": ["0"], "cluster": ["1"]}
    assert shard1["params"] == {"shard": ["1"]}
    assert shard0["honor_labels"] is True and shard1["honor_labels"] is True


def test_standalone_gets_every_slurm_series_and_the_global_tier_none():
    job = slurm_job("standalone")
    assert job is not None and "params" not in job
    assert slurm_job("global") is None


def test_the_shard_ids_are_the_ones_of_the_node_map():
    """The node map the slurm_exporter role writes names every shard a config asks for."""
    groups, _ = example_inventory()
    content = template_value(
        "slurm_exporter", "{{ groups | gpufleet_node_shards | to_json }}", "slurmctl01"
    )
    shards = json.loads(content)["shards"]
    assert set(shards) == {"0", "1"}
    # Each shard's map entry is exactly the hosts it scrapes (its node targets).
    for shard, hosts in shards.items():
        assert hosts == sorted(groups[f"prometheus_shard_{shard}"])
    asked = {slurm_job(mode)["params"]["shard"][0] for mode in ("shard", "shard-1")}
    assert asked == set(shards)


def test_user_slurm_job_settings_still_apply():
    job = slurm_job("shard-1", {"prometheus_job_settings": {"slurm": {"scheme": "https"}}})
    assert job["scheme"] == "https" and job["params"] == {"shard": ["1"]}


@pytest.mark.skipif(not shutil.which("promtool"), reason="promtool not installed")
@pytest.mark.parametrize("mode", ["global", "shard", "shard-1", "standalone"])
def test_each_config_passes_promtool(tmp_path: Path, mode):
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config(mode)))
    result = subprocess.run(
        ["promtool", "check", "config", "--syntax-only", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def job(mode: str, name: str, overrides: dict | None = None) -> dict:
    (found,) = [j for j in config(mode, overrides)["scrape_configs"] if j["job_name"] == name]
    return found


@pytest.mark.parametrize("mode", ["shard", "standalone"])
def test_the_ipmi_job_waits_for_slow_bmcs(mode):
    # An IPMI scrape asks the BMC for every sensor: the global 15 s / 10 s would time out.
    ipmi = job(mode, "ipmi")
    assert (ipmi["scrape_interval"], ipmi["scrape_timeout"]) == ("60s", "30s")
    # Other jobs keep the global interval and timeout; slurm keeps its honor_labels.
    assert "scrape_interval" not in job(mode, "node")
    assert "scrape_timeout" not in job(mode, "node")
    assert job(mode, "slurm")["honor_labels"] is True


def test_the_site_overrides_a_registry_job_setting():
    settings = {"prometheus_job_settings": {"ipmi": {"scrape_interval": "2m"}}}
    ipmi = job("shard", "ipmi", settings)
    assert (ipmi["scrape_interval"], ipmi["scrape_timeout"]) == ("2m", "30s")


def test_registry_job_settings_reach_any_job():
    registry = yaml.safe_load((ROLES / "_exporters" / "defaults" / "main.yml").read_text())
    entries = registry["exporters_registry"]
    entries["node"] = {**entries["node"], "job_settings": {"scrape_timeout": "12s"}}
    node = job("shard", "node", {"exporters_registry": entries})
    assert node["scrape_timeout"] == "12s"
