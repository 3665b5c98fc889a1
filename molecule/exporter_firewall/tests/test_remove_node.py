"""playbooks/remove_node.yml on real hosts: fw-exporter leaves the cluster.

Runs after test_exporter_firewall.py (files run in name order) and last: it is
destructive. Before it, one converge with a site inventory on top of the scenario's
(SITE below): fw-prom runs the exporter firewall too, and fw-exporter is in the
slurm_controller group, which fw-prom's firewall admits to Prometheus' port (as it
admits a Slurm controller's job summary epilog), so that a remaining host's firewall
has the leaving node among its sources; and a shard lock names all three hosts. Then:
refusals change nothing, check mode changes nothing, remove_node.yml removes
fw-exporter's exporters and firewall, its targets (Prometheus is not restarted), its
place in fw-prom's firewall and its lock entry; a rerun changes nothing, the uninstalls
change nothing on a host that never had them, and once the inventory no longer has
fw-exporter, a converge changes nothing either.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import testinfra
import yaml
from scenario_paths import CURL_TIMEOUT_RC, FIREWALL_UNIT, MOLECULE_INVENTORY, REPO, SCENARIO, TABLE
from testbed_helpers import eventually

from gpufleet.shardlock import format_lock, parse_lock

LEAVING = "fw-exporter"
PROM_UNIT = "gpufleet-prometheus-standalone.service"

# What the site adds to the scenario's inventory/ for this test (the lock file's path is
# filled in below).
SITE: dict[str, Any] = {
    "all": {
        "children": {
            "slurm_controller": {"hosts": {LEAVING: None}},
            "prometheus": {"hosts": {"fw-prom": {"exporter_firewall_enabled": True}}},
        }
    }
}


def host(name: str):
    return testinfra.get_host(f"ansible://{name}?ansible_inventory={MOLECULE_INVENTORY}")


EXPORTER, PROM, OTHER = host(LEAVING), host("fw-prom"), host("fw-other")


def address(name: str) -> str:
    return host(name).backend.get_variables()["ansible_host"]


def without_host(data: Any, name: str) -> Any:
    """An inventory's data with the host name taken out of every hosts: mapping."""
    if isinstance(data, dict):
        return {
            key: (
                {h: v for h, v in value.items() if h != name}
                if key == "hosts" and isinstance(value, dict)
                else without_host(value, name)
            )
            for key, value in data.items()
        }
    return data


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The site inventory and lock, and the inventories once fw-exporter is deleted."""
    top = tmp_path_factory.mktemp("remove_node")
    lock = top / ".shards.lock"
    lock.write_text(format_lock("fwtest", 1, {LEAVING: 0, "fw-prom": 0, "fw-other": 0}))
    site_data = {"all": {**SITE["all"], "vars": {"gpufleet_shard_lock": str(lock)}}}
    (top / "site").mkdir()
    (top / "site" / "site.yml").write_text(yaml.safe_dump(site_data))
    # The node list without fw-exporter: molecule's inventory, the scenario's and the site's.
    (top / "deleted").mkdir()
    molecule = yaml.safe_load(Path(MOLECULE_INVENTORY).read_text())
    (top / "deleted" / "molecule.yml").write_text(yaml.safe_dump(without_host(molecule, LEAVING)))
    scenario = yaml.safe_load((SCENARIO / "inventory" / "hosts.yml").read_text())
    (top / "deleted" / "hosts.yml").write_text(yaml.safe_dump(without_host(scenario, LEAVING)))
    (top / "deleted" / "site.yml").write_text(yaml.safe_dump(without_host(site_data, LEAVING)))
    return {"site": top / "site", "deleted": top / "deleted", "lock": lock}


def playbook(
    path: Path, *args: str, inventories: list[str] | None = None, timeout: int = 900
) -> subprocess.CompletedProcess:
    """ansible-playbook path with args, over the given inventories (default: molecule's,
    the scenario's and the site's)."""
    command = ["ansible-playbook"]
    for inventory in inventories or []:
        command += ["-i", inventory]
    command += [str(path), *args]
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)


def site_inventories(site: dict[str, Path]) -> list[str]:
    return [MOLECULE_INVENTORY, str(SCENARIO / "inventory"), str(site["site"])]


def remove(site: dict[str, Path], *args: str) -> subprocess.CompletedProcess:
    return playbook(
        REPO / "playbooks" / "remove_node.yml",
        "-e",
        f"gpufleet_remove_nodes={LEAVING}",
        *args,
        inventories=site_inventories(site),
    )


def recap(result: subprocess.CompletedProcess) -> dict[str, dict[str, int]]:
    """host -> its PLAY RECAP counters."""
    found = re.findall(
        r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)",
        result.stdout,
        re.MULTILINE,
    )
    assert found, result.stdout[-3000:] + result.stderr[-2000:]
    keys = ("ok", "changed", "unreachable", "failed")
    return {name: dict(zip(keys, map(int, counts), strict=True)) for name, *counts in found}


def changed(result: subprocess.CompletedProcess) -> dict[str, int]:
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    return {name: counts["changed"] for name, counts in recap(result).items() if counts["changed"]}


def folded(result: subprocess.CompletedProcess) -> str:
    """stdout and stderr with whitespace folded (the YAML callback wraps long lines)."""
    return " ".join((result.stdout + result.stderr).split())


def active_targets() -> set[str]:
    answer = PROM.run("curl -sS --max-time 5 http://127.0.0.1:9090/api/v1/targets?state=active")
    if answer.rc != 0:
        return set()
    return {t["scrapeUrl"] for t in json.loads(answer.stdout)["data"]["activeTargets"]}


def reaches_prometheus() -> int | str:
    """curl from fw-exporter to fw-prom's Prometheus: its HTTP code, or curl's rc."""
    url = f"http://{address('fw-prom')}:9090/-/ready"
    result = EXPORTER.run(f"curl -sS -o /dev/null -w '%{{http_code}}' --max-time 3 {url}")
    return result.stdout if result.rc == 0 else result.rc


EXPORTER_UNITS = ("node_exporter.service", "ipmi_exporter.service", FIREWALL_UNIT)
REMOVED_FILES = (
    "/etc/systemd/system/node_exporter.service",
    "/etc/systemd/system/ipmi_exporter.service",
    f"/etc/systemd/system/{FIREWALL_UNIT}",
    # The masks of the packages' own units.
    "/etc/systemd/system/prometheus-node-exporter.service",
    "/etc/systemd/system/prometheus-ipmi-exporter.service",
    "/etc/node_exporter",
    "/etc/ipmi_exporter",
    "/etc/gpufleet/exporter-firewall.nft",
    "/var/lib/node_exporter/textfile",
)


def test_the_site_converges_with_the_leaving_node_among_the_sources(site):
    """The starting point: fw-prom's firewall admits fw-exporter (a slurm_controller host)."""
    result = playbook(SCENARIO / "converge.yml", inventories=site_inventories(site))
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert eventually(lambda: reaches_prometheus() == "200", 30), reaches_prometheus()
    assert OTHER.run(f"curl -sS --max-time 3 http://{address('fw-prom')}:9090/-/ready").rc == (
        CURL_TIMEOUT_RC
    )
    node = f"http://{address(LEAVING)}:9102/metrics"
    assert eventually(lambda: node in active_targets(), 60), active_targets()


@pytest.mark.parametrize(
    ("names", "problem"),
    [
        ("fw-prom", "gpufleet_remove_nodes: fw-prom is a monitoring server (group prometheus)"),
        ("fw-exporter,gpu999", "gpufleet_remove_nodes: not in the inventory: gpu999"),
    ],
)
def test_a_server_or_an_unknown_name_is_refused_before_any_host_is_touched(site, names, problem):
    result = playbook(
        REPO / "playbooks" / "remove_node.yml",
        "-e",
        f"gpufleet_remove_nodes={names}",
        inventories=site_inventories(site),
    )
    assert result.returncode != 0
    assert problem in folded(result)
    assert set(recap(result)) == {"localhost"}, "a host was touched"
    assert EXPORTER.service("node_exporter.service").is_running


def test_check_mode_changes_nothing(site):
    lock = site["lock"].read_text()
    started = PROM.service(PROM_UNIT).systemd_properties["ActiveEnterTimestampMonotonic"]
    result = remove(site, "--check")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert recap(result)[LEAVING]["changed"] > 0, "check mode reported nothing to remove"
    uninstall = playbook(
        SCENARIO / "uninstall_exporters.yml",
        "--check",
        "--limit",
        LEAVING,
        inventories=site_inventories(site),
    )
    assert recap(uninstall)[LEAVING]["changed"] > 0
    for unit in EXPORTER_UNITS:
        assert EXPORTER.service(unit).is_running, unit
    assert EXPORTER.run(f"nft list table inet {TABLE}").rc == 0
    assert site["lock"].read_text() == lock
    assert PROM.service(PROM_UNIT).systemd_properties["ActiveEnterTimestampMonotonic"] == started
    assert f"http://{address(LEAVING)}:9102/metrics" in active_targets()


def test_remove_node_removes_the_exporters_targets_sources_and_lock_entry(site):
    started = PROM.service(PROM_UNIT).systemd_properties["ActiveEnterTimestampMonotonic"]
    result = remove(site)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]

    # On fw-exporter: its exporters and firewall are stopped and gone.
    for unit in EXPORTER_UNITS:
        # Not is_enabled: testinfra raises for a unit systemd does not know.
        assert not EXPORTER.service(unit).is_running, unit
        assert EXPORTER.run(f"systemctl cat {unit}").rc != 0, f"systemd still knows {unit}"
    for path in REMOVED_FILES:
        assert not EXPORTER.file(path).exists, path
    for package in ("prometheus-node-exporter", "prometheus-ipmi-exporter"):
        assert not EXPORTER.package(package).is_installed, package
    assert not EXPORTER.user("node-exporter").exists
    assert EXPORTER.run(f"nft list table inet {TABLE}").rc != 0
    assert EXPORTER.run("ss -Htln '( sport = :9102 or sport = :9290 )'").stdout.strip() == ""
    # What is a tool of its own stays.
    assert EXPORTER.package("nftables").is_installed

    # Prometheus scrapes nothing of it, and was not restarted for that.
    target = address(LEAVING)
    assert eventually(lambda: not any(target in url for url in active_targets()), 60), (
        active_targets()
    )
    assert PROM.service(PROM_UNIT).systemd_properties["ActiveEnterTimestampMonotonic"] == started
    targets = json.loads(
        PROM.check_output("cat /etc/gpufleet/prometheus/standalone/targets/node.json")
    )
    assert all(group["labels"]["node"] != LEAVING for group in targets)

    # fw-prom's firewall admits it no more; fw-prom itself still reaches its Prometheus.
    assert eventually(lambda: reaches_prometheus() == CURL_TIMEOUT_RC, 30), reaches_prometheus()
    assert PROM.run("curl -sSf -o /dev/null --max-time 3 http://127.0.0.1:9090/-/ready").rc == 0

    # The shard lock keeps the others on their shard.
    lock = parse_lock(site["lock"].read_text(), str(site["lock"]))
    assert dict(lock.hosts) == {"fw-other": 0, "fw-prom": 0}
    assert site["lock"].read_text() == format_lock("fwtest", 1, {"fw-other": 0, "fw-prom": 0})


def test_a_rerun_changes_nothing(site):
    assert changed(remove(site)) == {}


def test_the_uninstalls_change_nothing_where_nothing_is_left_or_never_was(site):
    result = playbook(
        SCENARIO / "uninstall_exporters.yml",
        "--limit",
        f"{LEAVING},fw-other",
        inventories=site_inventories(site),
    )
    assert changed(result) == {}
    check = playbook(
        SCENARIO / "uninstall_exporters.yml",
        "--check",
        "--limit",
        f"{LEAVING},fw-other",
        inventories=site_inventories(site),
    )
    assert changed(check) == {}


def test_once_the_inventory_no_longer_has_the_node_a_converge_changes_nothing(site):
    deleted = site["deleted"]
    inventories = [str(deleted / name) for name in ("molecule.yml", "hosts.yml", "site.yml")]
    result = playbook(SCENARIO / "converge.yml", inventories=inventories)
    assert changed(result) == {}
    assert LEAVING not in recap(result)
