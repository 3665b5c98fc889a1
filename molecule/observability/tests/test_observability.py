"""Grafana, Loki and Alloy roles on a real systemd host; Loki and Alloy are stand-ins.

Grafana runs with grafana_install_method: none (files only: its package is exercised by
molecule/grafana). Loki runs with loki_install_method: binary and Alloy with
alloy_install_method: package, against release-shaped artifacts that prepare.yml builds
around the stand-ins in molecule/testbed/standins/ (Python test doubles of the `loki`
binary and of `/usr/bin/alloy` in a .deb shaped like upstream's) and serves from a
loopback mirror. So the roles' real install paths run: controller download, sha256
check, unzip / apt install of the .deb, `validate:` with `loki -verify-config` and
`alloy fmt` (wired: the stand-ins refuse only a marker; the rendered configs are checked
against Loki's and Alloy's documented schemas by tests/unit/test_loki_alloy_schema.py),
the units and drop-in, service start. What the stand-ins do not do is not tested
anywhere here: real Loki and Alloy behaviour (log ingestion and storage, reading the
journal, LogQL, the ruler and its alerts).

This file checks the converged state: users, directories and modes, grafana.ini,
provisioning files derived from the inventory, the dashboards copied from the
repository (a stale one removed), the Loki configuration and rules, config.alloy, the
Alloy drop-in and environment, the installed binary and package, and the running
services. test_reconverge.py then changes things and reruns the playbook.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path

import yaml
from observability_helpers import (
    ALLOY_ADDRESS,
    ALLOY_BINARY,
    LOKI_BINARY,
    alloy_config_hash,
    alloy_metrics,
    built,
    fetch,
    fetch_on_host,
    main_pid,
    metrics,
    process,
)
from testbed_helpers import host_address

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


def test_grafana_is_not_installed(host):
    # grafana_install_method: none here: files only, no package, no service.
    assert not host.package("grafana").is_installed
    assert not host.service("grafana-server").is_running


def test_loki_binary_is_the_verified_release(host):
    binary = host.file(LOKI_BINARY)
    assert binary.user == "root" and binary.mode == 0o755
    assert binary.sha256sum == built()["loki"]["binary_sha256"]
    version = host.check_output(f"{LOKI_BINARY} -version")
    assert version.startswith(f"loki, version {built()['loki']['version']} ")


def test_loki_runs_as_loki_from_the_installed_binary(host):
    service = host.service("loki")
    assert service.is_running and service.is_enabled
    proc = process(host, main_pid(host, "loki"))
    assert proc["argv"][1:] == [LOKI_BINARY, "-config.file=/etc/loki/loki.yml", "-target=all"]
    assert proc["uid"] == host.user("loki").uid and proc["gid"] == host.group("loki").gid


def test_loki_answers_on_the_configured_address_and_port(host):
    # loki_listen_address 0.0.0.0, loki_http_port 3100: reachable from the controller.
    assert fetch(f"http://{host_address(host)}:3100/ready") == (200, "ready\n")
    status, body = fetch(f"http://{host_address(host)}:3100/metrics")
    assert status == 200
    build_info = [s for s in metrics(body) if s.startswith("loki_build_info{")]
    assert len(build_info) == 1 and f'version="{built()["loki"]["version"]}"' in build_info[0]
    # What Loki loaded is the file the role wrote.
    assert fetch(f"http://{host_address(host)}:3100/config") == (
        200,
        host.file("/etc/loki/loki.yml").content_string,
    )


def test_loki_accepts_pushes_on_the_url_alloy_ships_to(host):
    (url,) = re.findall(
        r'^\s*url = "([^"]+)"$', host.file("/etc/alloy/config.alloy").content_string, re.M
    )
    assert url == f"http://{host_address(host)}:3100/loki/api/v1/push"
    series = 'loki_distributor_lines_received_total{tenant="fake"}'

    def received() -> int:
        return int(metrics(fetch(f"http://{host_address(host)}:3100/metrics")[1]).get(series, 0))

    before = received()
    push = {"streams": [{"stream": {"job": "molecule"}, "values": [[str(time.time_ns()), "a"]]}]}
    # From the host, as Alloy would send (auth_enabled false: the `fake` tenant).
    status = host.check_output(
        "curl -sS -o /dev/null -w '%%{http_code}' -H 'Content-Type: application/json' "
        "--data-binary %s %s",
        json.dumps(push),
        url,
    )
    assert status == "204"
    assert received() == before + 1


def test_alloy_package_from_the_mirror_is_installed(host):
    alloy = built()["alloy"]
    status = host.check_output("dpkg-query -W -f '${Version} ${Status}' alloy")
    assert status == f"{alloy['version']}-1 install ok installed"
    assert host.file(ALLOY_BINARY).sha256sum == alloy["binary_sha256"]
    cached = f"/var/cache/gpufleet/alloy-{alloy['version']}-1.{alloy['arch']}.deb"
    assert host.file(cached).sha256sum == alloy["sha256"]
    # The role's files replaced the package's conffiles; the package's unit is used.
    assert "--disable-reporting" in host.file("/etc/default/alloy").content_string
    assert "loki.write" in host.file("/etc/alloy/config.alloy").content_string


def test_alloy_runs_the_package_unit_with_the_drop_in(host):
    service = host.service("alloy")
    assert service.is_running and service.is_enabled
    props = service.systemd_properties
    assert props["FragmentPath"] in (
        "/lib/systemd/system/alloy.service",
        "/usr/lib/systemd/system/alloy.service",
    )
    assert props["DropInPaths"] == "/etc/systemd/system/alloy.service.d/gpufleet.conf"
    assert props["SupplementaryGroups"] == "systemd-journal adm"
    proc = process(host, main_pid(host, "alloy"))
    assert proc["argv"][1:] == [
        ALLOY_BINARY,
        "run",
        f"--server.http.listen-addr={ALLOY_ADDRESS}",
        "--disable-reporting",
        "--storage.path=/var/lib/alloy/data",
        "/etc/alloy/config.alloy",
    ]
    assert proc["uid"] == host.user("alloy").uid
    assert {host.group("systemd-journal").gid, host.group("adm").gid} <= proc["groups"]


def test_alloy_answers_on_its_loopback_address_only(host):
    assert fetch_on_host(host, f"http://{ALLOY_ADDRESS}/-/ready") == (200, "Alloy is ready.\n")
    series = alloy_metrics(host)
    assert alloy_config_hash(series) == host.file("/etc/alloy/config.alloy").sha256sum
    assert series["alloy_config_last_load_successful"] == "1"
    assert f'version="v{built()["alloy"]["version"]}"' in next(
        s for s in series if s.startswith("alloy_build_info{")
    )
    # alloy_listen_address is 127.0.0.1: nothing answers on the host's own address.
    assert fetch(f"http://{host_address(host)}:12345/-/ready", timeout=3)[0] == 0
