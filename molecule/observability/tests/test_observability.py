"""Grafana, Loki and Alloy roles with *_install_method: none on a real systemd host.

Everything the roles do without the vendor packages is checked here: system users,
directories and modes, grafana.ini, provisioning files derived from the inventory,
the dashboards copied from the repository (and a stale one removed), the Loki
configuration and ruler rules, config.alloy, the Alloy drop-in and environment, and the
Loki unit. Nothing is started: the packages are not installable on the test bed.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import yaml

testinfra_hosts = ["all"]
REPO = Path(__file__).resolve().parents[3]
DASHBOARDS = REPO / "roles" / "grafana" / "files" / "dashboards"
ADDRESS = "10.203.14.11"


def read_yaml(host, path):
    return yaml.safe_load(host.file(path).content_string)


def test_system_users(host):
    homes = {"grafana": "/usr/share/grafana", "loki": "/var/lib/loki", "alloy": "/var/lib/alloy"}
    for name, home in homes.items():
        user = host.user(name)
        assert user.exists and user.group == name and user.home == home
        assert user.uid < 1000, f"{name} is not a system user"
    # The groups the Alloy drop-in adds must exist for the unit to start.
    assert host.group("systemd-journal").exists and host.group("adm").exists


def test_grafana_ini_is_private_and_safe(host):
    ini = host.file("/etc/grafana/grafana.ini")
    assert ini.user == "root" and ini.group == "grafana" and ini.mode == 0o640
    text = ini.content_string
    assert "admin_password = molecule-only-Jq83vLx2" in text
    assert "[auth.anonymous]\nenabled = false" in text
    assert "reporting_enabled = false" in text


def test_datasources_from_the_inventory(host):
    path = "/etc/grafana/provisioning/datasources/gpufleet.yml"
    assert host.file(path).mode == 0o640 and host.file(path).group == "grafana"
    doc = read_yaml(host, path)
    urls = {ds["uid"]: ds["url"] for ds in doc["datasources"]}
    assert urls == {
        "gpufleet-prometheus": f"http://{ADDRESS}:9090",
        "gpufleet-prometheus-shard-0": f"http://{ADDRESS}:9091",
        "gpufleet-prometheus-shard-1": f"http://{ADDRESS}:9092",
        "gpufleet-alertmanager": f"http://{ADDRESS}:9093",
        "gpufleet-loki": f"http://{ADDRESS}:3100",
    }


def test_dashboards_are_the_repository_files(host):
    folder = "/var/lib/grafana/dashboards/gpufleet"
    on_host = {Path(p).name for p in host.check_output(f"ls {folder}").split()}
    shipped = {p.name for p in DASHBOARDS.glob("*.json")}
    assert on_host == shipped, "stale.json should have been removed"
    for name in shipped:
        expected = hashlib.sha256((DASHBOARDS / name).read_bytes()).hexdigest()
        assert host.file(f"{folder}/{name}").sha256sum == expected
    provider = read_yaml(host, "/etc/grafana/provisioning/dashboards/gpufleet.yml")
    assert provider["providers"][0]["options"]["path"] == folder
    assert json.loads(host.file(f"{folder}/logs.json").content_string)["uid"] == "gpufleet-logs"


def test_loki_config_and_rules(host):
    cfg = read_yaml(host, "/etc/loki/loki.yml")
    assert cfg["schema_config"]["configs"][0]["schema"] == "v13"
    assert cfg["compactor"]["retention_enabled"] is True
    assert cfg["ruler"]["alertmanager_url"] == f"http://{ADDRESS}:9093"
    rules = read_yaml(host, "/etc/loki/rules/fake/gpufleet-logs.yml")
    assert "NvidiaXidCritical" in {r["alert"] for g in rules["groups"] for r in g["rules"]}
    data = host.file("/var/lib/loki")
    assert data.is_directory and data.user == "loki" and data.mode == 0o750
    unit = host.file("/etc/systemd/system/loki.service").content_string
    assert "ExecStart=/usr/local/bin/loki -config.file=/etc/loki/loki.yml -target=all" in unit


def test_alloy_config_dropin_and_environment(host):
    config = host.file("/etc/alloy/config.alloy")
    assert config.group == "alloy" and config.mode == 0o640
    text = config.content_string
    assert f'url = "http://{ADDRESS}:3100/loki/api/v1/push"' in text
    for label in ('node = "gpufleet-obs-1"', 'cluster = "obs"', 'rack = "r09"'):
        assert label in text
    assert text.count("{") == text.count("}")
    dropin = host.file("/etc/systemd/system/alloy.service.d/gpufleet.conf").content_string
    assert "SupplementaryGroups=systemd-journal adm" in dropin
    assert 'CONFIG_FILE="/etc/alloy/config.alloy"' in host.file("/etc/default/alloy").content_string


def test_nothing_was_started(host):
    for unit in ("grafana-server", "loki", "alloy"):
        assert not host.service(unit).is_running
