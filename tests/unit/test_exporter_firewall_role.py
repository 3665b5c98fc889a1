"""The exporter_firewall role: which ports it protects, whom it lets in, what it loads.

What runs for real: gpufleet's filters on hand-made and example-inventory host
variables; the role's rules template rendered by Ansible's own Templar for hosts of the
example inventory (tests/golden/example-inventory.json); the rendered rules checked by
nft itself (a kernel transaction that is never committed) and loaded into a private
network namespace, where that is allowed; the unit checked by systemd-analyze.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible.plugins.loader import filter_loader

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plugins" / "filter"))

from gpufleet_filters import gpufleet_exporter_ports, gpufleet_firewall_sources
from render_role import ROLES, ROOT, example_inventory, render, systemd_verify_problems

filter_loader.add_directory(str(ROOT / "plugins" / "filter"))

ROLE = "exporter_firewall"
ENABLED = {"exporter_firewall_enabled": True}


# --- allowed sources ---------------------------------------------------------------------


def test_sources_are_the_hosts_addresses_split_by_family() -> None:
    hostvars = {
        "mon01": {"ansible_host": "10.1.9.1"},
        "mon02": {"ansible_host": "fd00::9:2"},
        "gpu001": {"ansible_host": "10.1.1.1"},
    }
    sources = gpufleet_firewall_sources(["mon02", "mon01"], hostvars)
    assert sources == {"ipv4": ["10.1.9.1"], "ipv6": ["fd00::9:2"]}


def test_extra_sources_are_collapsed_with_the_hosts() -> None:
    hostvars = {"mon01": {"ansible_host": "10.1.9.1"}, "mon02": {"ansible_host": "10.1.9.2"}}
    sources = gpufleet_firewall_sources(
        ["mon01", "mon02", "mon01"], hostvars, ["10.1.9.0/30", "10.2.0.7", "2001:db8::/64"]
    )
    # nftables refuses overlapping intervals: 10.1.9.1 and .2 lie inside 10.1.9.0/30.
    assert sources == {"ipv4": ["10.1.9.0/30", "10.2.0.7"], "ipv6": ["2001:db8::/64"]}


def test_source_addresses_of_a_prometheus_host_replace_its_ansible_host() -> None:
    hostvars = {
        "mon01": {
            "ansible_host": "mon01.mgmt.example",
            "exporter_firewall_source_addresses": ["10.7.0.1", "fd00:7::1"],
        }
    }
    sources = gpufleet_firewall_sources(["mon01"], hostvars)
    assert sources == {"ipv4": ["10.7.0.1"], "ipv6": ["fd00:7::1"]}


def test_a_prometheus_host_known_only_by_name_is_refused_with_the_fix() -> None:
    hostvars = {"mon01": {"ansible_host": "mon01.example"}}
    with pytest.raises(ValueError, match=r"mon01: ansible_host 'mon01.example' is not an IP"):
        gpufleet_firewall_sources(["mon01"], hostvars)
    with pytest.raises(ValueError, match="exporter_firewall_source_addresses"):
        gpufleet_firewall_sources(["mon01"], {"mon01": {}})


@pytest.mark.parametrize("bad", ["10.0.0.5/24", "10.0.0.300", "vmagent.example", ""])
def test_bad_extra_sources_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="exporter_firewall_extra_sources"):
        gpufleet_firewall_sources([], {}, [bad])


# --- protected ports ---------------------------------------------------------------------

EXPORTERS = {
    "node_exporter": {"group": "all", "port": "9100"},
    "dcgm_exporter": {"group": "gpu_collector_dcgm", "port": 9400},
    "slurm_exporter": {"group": "slurm_controller", "port": 9341},
}


@pytest.mark.parametrize(
    ("group_names", "extra", "expected"),
    [
        ([], [], [9100]),
        (["gpu_nodes", "gpu_collector_dcgm"], [], [9100, 9400]),
        (["gpu_collector_smi"], [], [9100]),
        (["slurm_controller", "servers"], [9100, 8080], [8080, 9100, 9341]),
    ],
)
def test_ports_are_those_of_the_exporters_on_the_host(group_names, extra, expected) -> None:
    assert gpufleet_exporter_ports(EXPORTERS, group_names, extra) == expected


@pytest.mark.parametrize("bad", [0, 70000, "http"])
def test_bad_ports_are_refused(bad) -> None:
    with pytest.raises(ValueError, match="is not a TCP port"):
        gpufleet_exporter_ports(EXPORTERS, [], [bad])


# --- in step with the exporter roles and playbooks ---------------------------------------


def load(path: Path):
    return yaml.safe_load(path.read_text())


def test_exporters_match_the_exporter_roles_ports_and_playbooks() -> None:
    exporters = load(ROLES / ROLE / "vars" / "main.yml")["_exporter_firewall_exporters"]
    assert set(exporters) == {"node_exporter", "dcgm_exporter", "slurm_exporter"}
    for name, spec in exporters.items():
        variable, fallback = re.fullmatch(
            r"\{\{ (\w+) \| default\((\d+)\) \}\}", spec["port"]
        ).groups()
        assert variable == f"{name}_port"
        assert int(fallback) == load(ROLES / name / "defaults" / "main.yml")[variable], name
        play = load(ROOT / "playbooks" / f"{name}.yml")[0]
        assert play["hosts"] == spec["group"], f"{name}: the playbook runs on {play['hosts']}"


def test_prometheus_scrapes_the_exporters_from_the_same_groups() -> None:
    """The prometheus role builds its targets from the groups the firewall reads."""
    exporters = load(ROLES / ROLE / "vars" / "main.yml")["_exporter_firewall_exporters"]
    instance = (ROLES / "prometheus" / "tasks" / "instance.yml").read_text()
    for name in ("dcgm_exporter", "slurm_exporter"):
        assert f"groups['{exporters[name]['group']}']" in instance, name
    defaults = load(ROLES / "prometheus" / "defaults" / "main.yml")["prometheus_exporter_ports"]
    for job, name in (
        ("node", "node_exporter"),
        ("dcgm", "dcgm_exporter"),
        ("slurm", "slurm_exporter"),
    ):
        assert defaults[job] == load(ROLES / name / "defaults" / "main.yml")[f"{name}_port"]


def test_site_runs_the_firewall_after_every_exporter() -> None:
    order = [play["ansible.builtin.import_playbook"] for play in load(ROOT / "site.yml")]
    firewall = order.index("playbooks/exporter_firewall.yml")
    for name in ("node_exporter", "dcgm_exporter", "slurm_exporter"):
        assert order.index(f"playbooks/{name}.yml") < firewall
    assert load(ROOT / "playbooks" / "exporter_firewall.yml")[0]["hosts"] == "all"


# --- rendered rules on the example inventory ---------------------------------------------


def rules(host: str, overrides: dict | None = None, inventory=None) -> str:
    groups, hostvars = inventory or example_inventory()
    # As Ansible sets it: the groups the host is in.
    group_names = sorted(g for g, hosts in groups.items() if host in hosts and g != "all")
    variables = {**ENABLED, "group_names": group_names, **(overrides or {})}
    return render(ROLE, "exporter-firewall.nft.j2", host, variables, (groups, hostvars))


def elements(text: str, name: str) -> list[str]:
    block = re.search(rf"set {name} \{{\n(.*?)\n\t\}}", text, re.S).group(1)
    found = re.search(r"elements = \{ (.*) \}", block)
    return found.group(1).split(", ") if found else []


@pytest.mark.parametrize(
    ("host", "ports"),
    [
        ("gpu001", ["9100", "9400"]),  # gpu_collector: dcgm
        ("l40s01", ["9100"]),  # gpu_collector: smi, no exporter of its own
        ("slurmctl01", ["9100", "9341"]),
        ("mon01", ["9100"]),
    ],
)
def test_rules_protect_the_exporters_of_each_host(host: str, ports: list[str]) -> None:
    text = rules(host)
    assert elements(text, "exporter_ports") == ports
    assert elements(text, "allowed_ipv4") == ["10.1.9.1", "10.1.9.2"]  # mon01, mon02
    assert elements(text, "allowed_ipv6") == []
    assert "counter drop" in text and "reject" not in text.split("chain exporter_access")[1]


def test_rules_follow_the_exporters_port_variables_and_extras() -> None:
    text = rules(
        "gpu001",
        {
            "node_exporter_port": 9200,
            "exporter_firewall_extra_ports": [8080],
            "exporter_firewall_extra_sources": ["192.0.2.0/24", "2001:db8::5"],
            "exporter_firewall_action": "reject",
        },
    )
    assert elements(text, "exporter_ports") == ["8080", "9200", "9400"]
    assert elements(text, "allowed_ipv4") == ["10.1.9.1", "10.1.9.2", "192.0.2.0/24"]
    assert elements(text, "allowed_ipv6") == ["2001:db8::5"]
    assert "counter reject with tcp reset" in text


def test_rules_replace_only_gpufleets_table_in_one_file() -> None:
    text = rules("cpu01")
    statements = [
        line for line in text.splitlines() if line.startswith(("table", "delete", "flush"))
    ]
    assert statements == [
        "table inet gpufleet_exporters {}",
        "delete table inet gpufleet_exporters",
        "table inet gpufleet_exporters {",
    ]
    assert "policy accept;" in text
    assert "hook input" in text


def nft_allowed() -> bool:
    return bool(shutil.which("nft")) and os.geteuid() == 0


@pytest.mark.skipif(not nft_allowed(), reason="needs nft and root")
@pytest.mark.parametrize("action", ["drop", "reject"])
def test_rendered_rules_pass_nft_in_a_private_network_namespace(
    action: str, tmp_path: Path
) -> None:
    path = tmp_path / "rules.nft"
    path.write_text(rules("gpu001", {"exporter_firewall_action": action}))
    # Loaded twice in a throwaway namespace: the second load replaces the first (the
    # reload), and the host's own ruleset is never touched.
    script = f"nft -f {path} && nft -f {path} && nft -j list table inet gpufleet_exporters"
    run = subprocess.run(
        ["unshare", "--net", "sh", "-c", script], capture_output=True, text=True, timeout=60
    )
    if "Operation not permitted" in run.stderr:
        pytest.skip("no permission to create a network namespace here")
    assert run.returncode == 0, run.stderr
    listed = json.loads(run.stdout)["nftables"]
    sets = {item["set"]["name"]: item["set"].get("elem", []) for item in listed if "set" in item}
    assert sets["exporter_ports"] == [9100, 9400]
    assert sets["allowed_ipv4"] == ["10.1.9.1", "10.1.9.2"]
    chains = [item["chain"] for item in listed if "chain" in item]
    assert [(c["name"], c.get("hook"), c.get("policy")) for c in chains] == [
        ("input", "input", "accept"),
        ("exporter_access", None, None),
    ]


def test_a_prometheus_host_by_dns_name_fails_rendering_with_the_fix() -> None:
    groups, hostvars = example_inventory()
    hostvars = {**hostvars, "mon02": {**hostvars["mon02"], "ansible_host": "mon02.example"}}
    with pytest.raises(Exception, match="exporter_firewall_source_addresses"):
        rules("gpu001", inventory=(groups, hostvars))


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze not installed")
def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    text = render(ROLE, "gpufleet-exporter-firewall.service.j2", "cpu01", ENABLED)
    assert "ExecReload=/usr/sbin/nft -f /etc/gpufleet/exporter-firewall.nft" in text
    assert "ExecStart=/usr/sbin/nft -f /etc/gpufleet/exporter-firewall.nft" in text
    unit = tmp_path / "gpufleet-exporter-firewall.service"
    unit.write_text(re.sub(r"(Exec\w+=)/usr/sbin/nft", r"\1/bin/true", text))
    assert not systemd_verify_problems(unit)
