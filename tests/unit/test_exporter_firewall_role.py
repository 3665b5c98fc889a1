"""The exporter_firewall role: which ports it protects, whom it lets in, what it loads.

What runs for real: gpufleet.firewall (the filters gpufleet_firewall_sources and
gpufleet_firewall_rules) on hand-made and example-inventory host variables; the role's
service table and rules template rendered by Ansible's own Templar for hosts of the
example inventory (tests/golden/example-inventory.json) and of a hand-made one with every
gpufleet server; the rendered rules checked by nft itself (a kernel transaction that is
never committed) and loaded into a private network namespace, where that is allowed; the
unit checked by systemd-analyze.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from ansible.plugins.loader import filter_loader
from render_role import (
    ROLES,
    ROOT,
    evaluate,
    example_inventory,
    render,
    systemd_verify_problems,
    template_value,
)

from gpufleet.firewall import rules as firewall_rules
from gpufleet.firewall import sources as firewall_sources

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
    sources = firewall_sources(["mon02", "mon01"], hostvars)
    assert sources == {"ipv4": ["10.1.9.1"], "ipv6": ["fd00::9:2"]}


def test_extra_sources_are_collapsed_with_the_hosts() -> None:
    hostvars = {"mon01": {"ansible_host": "10.1.9.1"}, "mon02": {"ansible_host": "10.1.9.2"}}
    sources = firewall_sources(
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
    sources = firewall_sources(["mon01"], hostvars)
    assert sources == {"ipv4": ["10.7.0.1"], "ipv6": ["fd00:7::1"]}


def test_a_prometheus_host_known_only_by_name_is_refused_with_the_fix() -> None:
    hostvars = {"mon01": {"ansible_host": "mon01.example"}}
    with pytest.raises(ValueError, match=r"mon01: ansible_host 'mon01.example' is not an IP"):
        firewall_sources(["mon01"], hostvars)
    with pytest.raises(ValueError, match="exporter_firewall_source_addresses"):
        firewall_sources(["mon01"], {"mon01": {}})


@pytest.mark.parametrize("bad", ["10.0.0.5/24", "10.0.0.300", "vmagent.example", ""])
def test_bad_extra_sources_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="exporter_firewall_extra_sources"):
        firewall_sources([], {}, [bad])


def test_an_address_list_is_named_in_its_error() -> None:
    with pytest.raises(ValueError, match=r"exporter_firewall_admin_sources: 'admin.example'"):
        firewall_sources([], {}, ["admin.example"], "exporter_firewall_admin_sources")


# --- protected ports ---------------------------------------------------------------------

EXPORTER_SOURCES = {
    "rule": "exporter",
    "source_groups": ["prometheus", "prometheus_global"],
    "source_variables": ["exporter_firewall_extra_sources"],
}


def exporters(extra_ports) -> dict:
    """The exporters of the role's service table, in the filter's data shape."""
    return {
        "node_exporter": {"group": "all", "tcp": {"node_exporter_port": "9100"}},
        "dcgm_exporter": {"group": "gpu_collector_dcgm", "tcp": {"dcgm_exporter_port": 9400}},
        "slurm_exporter": {"group": "slurm_controller", "tcp": {"slurm_exporter_port": 9341}},
        "extra_ports": {"group": "all", "tcp": {"exporter_firewall_extra_ports": extra_ports}},
    }


def exporter_ports(group_names: list[str], extra_ports) -> list[int]:
    services = {name: {**spec, **EXPORTER_SOURCES} for name, spec in exporters(extra_ports).items()}
    hostvars = {"mon01": {"ansible_host": "10.1.9.1"}}
    lists = {"exporter_firewall_extra_sources": []}
    (rule,) = firewall_rules(services, group_names, {"prometheus": ["mon01"]}, hostvars, lists)
    assert rule["name"] == "exporter" and rule["udp"] == []
    return rule["tcp"]


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
    assert exporter_ports(group_names, extra) == expected


@pytest.mark.parametrize("bad", [0, 70000, "http", True, None, "9100/tcp"])
def test_bad_ports_are_refused(bad) -> None:
    with pytest.raises(ValueError, match=r"exporter_firewall_extra_ports: .* is not a TCP port"):
        exporter_ports([], [bad])


def test_a_port_two_rules_claim_is_refused_naming_both_variables() -> None:
    services = {
        "node_exporter": {"group": "all", "rule": "exporter", "tcp": {"node_exporter_port": 9100}},
        "loki": {"group": "loki", "tcp": {"loki_http_port": 9100}},
    }
    with pytest.raises(
        ValueError, match=r"TCP port 9100 is both loki_http_port .* node_exporter_port"
    ):
        firewall_rules(services, ["loki"], {}, {})
    # The same port over UDP is another port.
    services["loki"] = {"group": "loki", "udp": {"loki_http_port": 9100}}
    assert [r["name"] for r in firewall_rules(services, ["loki"], {}, {})] == [
        "exporter",
        "loki",
    ]


# --- in step with the exporter roles and playbooks ---------------------------------------


def load(path: Path):
    return yaml.safe_load(path.read_text())


def services() -> dict:
    """The service table: the servers as written, the registry's exporters as the role
    builds them (on a host without port overrides: each port its default)."""
    table = dict(load(ROLES / ROLE / "vars" / "main.yml")["_exporter_firewall_servers"])
    table.update(evaluate(ROLE, "_exporter_firewall_exporters", "gpu001", ENABLED))
    return table


EXPORTERS = {"node_exporter", "dcgm_exporter", "slurm_exporter", "ipmi_exporter"}


def test_exporters_match_the_exporter_roles_ports_and_playbooks() -> None:
    table = services()
    exporters = {name: spec for name, spec in table.items() if spec.get("rule") == "exporter"}
    assert set(exporters) == {*EXPORTERS, "extra_ports"}
    assert exporters.pop("extra_ports")["tcp"] == {
        "exporter_firewall_extra_ports": "{{ exporter_firewall_extra_ports }}"
    }
    for name, spec in exporters.items():
        ((variable, value),) = spec["tcp"].items()
        assert variable == f"{name}_port"
        assert value == role_default(name, variable)
        play = load(ROOT / "playbooks" / f"{name}.yml")[0]
        assert play["hosts"] == spec["group"], f"{name}: the playbook runs on {play['hosts']}"
        assert "udp" not in spec


def role_default(role: str, variable: str):
    return load(ROLES / role / "defaults" / "main.yml")[variable]


# The service each table entry protects belongs to this role and its playbook.
SERVER_ROLES = {
    "prometheus": "prometheus",
    "alertmanager": "alertmanager",
    "alertmanager_gossip": "alertmanager",
    "loki": "loki",
    "loki_grpc": "loki",
    "victoriametrics": "victoriametrics",
}


def test_servers_match_the_server_roles_ports_and_playbooks() -> None:
    table = services()
    assert set(table) == {*EXPORTERS, "extra_ports", *SERVER_ROLES}
    for name, role in SERVER_ROLES.items():
        spec = table[name]
        assert "rule" not in spec, f"{name} has a rule of its own"
        play = load(ROOT / "playbooks" / f"{role}.yml")[0]
        assert play["hosts"] == spec["group"], f"{name}: the playbook runs on {play['hosts']}"
        for protocol in ("tcp", "udp"):
            for variable, value in (spec.get(protocol) or {}).items():
                fallback = re.search(rf"\b{variable} \| default\(([^)]+)\)", value)
                assert fallback, f"{name}: {value} does not read {variable}"
                default = evaluate(ROLE, fallback.group(1), "gpu001", ENABLED)
                assert int(default) == role_default(role, variable), (name, variable)
    ports = {
        name: {p: list(spec.get(p, {})) for p in ("tcp", "udp")} for name, spec in table.items()
    }
    assert ports["prometheus"] == {"tcp": ["prometheus_port_base"], "udp": []}
    assert ports["alertmanager"] == {"tcp": ["alertmanager_port"], "udp": []}
    assert ports["alertmanager_gossip"] == {
        "tcp": ["alertmanager_cluster_port"],
        "udp": ["alertmanager_cluster_port"],
    }
    assert ports["loki"] == {"tcp": ["loki_http_port"], "udp": []}
    assert ports["loki_grpc"] == {"tcp": ["loki_grpc_port"], "udp": []}
    assert ports["victoriametrics"] == {"tcp": ["victoriametrics_port"], "udp": []}


def test_prometheus_ports_follow_the_prometheus_roles_instances() -> None:
    value = services()["prometheus"]["tcp"]["prometheus_port_base"]
    fallback = re.search(r"prometheus_instances \| default\((.*?)\)\s*\|", value).group(1)
    assert f"{{{{ {fallback} }}}}" == role_default("prometheus", "prometheus_instances")
    assert "gpufleet_prometheus_port" in value


ADMIN = "exporter_firewall_admin_sources"
EXTRA = "exporter_firewall_extra_sources"


def test_sources_are_the_clients_of_each_service() -> None:
    """Who connects to what (docs/firewall.md): the table's policy, pinned."""
    sources = {
        name: (spec.get("source_groups"), spec.get("source_variables"))
        for name, spec in services().items()
    }
    assert sources == {
        "node_exporter": (["prometheus", "prometheus_global"], [EXTRA]),
        "dcgm_exporter": (["prometheus", "prometheus_global"], [EXTRA]),
        "slurm_exporter": (["prometheus", "prometheus_global"], [EXTRA]),
        "ipmi_exporter": (["prometheus", "prometheus_global"], [EXTRA]),
        "extra_ports": (["prometheus", "prometheus_global"], [EXTRA]),
        # slurm_controller: the job summary epilog (slurm_exporter_job_summary) asks it.
        "prometheus": (["prometheus", "prometheus_global", "grafana", "slurm_controller"], [ADMIN]),
        "alertmanager": (["prometheus", "prometheus_global", "grafana", "loki"], [ADMIN]),
        "alertmanager_gossip": (["alertmanager"], None),
        "loki": (["all", "grafana"], [ADMIN]),
        "loki_grpc": (["loki"], None),
        "victoriametrics": (["prometheus", "prometheus_global", "grafana"], [ADMIN]),
    }
    assert set(load(ROLES / ROLE / "vars" / "main.yml")["_exporter_firewall_address_lists"]) == {
        ADMIN,
        EXTRA,
    }
    # The clients run where the table expects them: Alloy (which pushes to Loki) on
    # every host, Grafana on its group.
    assert load(ROOT / "playbooks" / "alloy.yml")[0]["hosts"] == "all"
    assert load(ROOT / "playbooks" / "grafana.yml")[0]["hosts"] == "grafana"


def test_site_runs_the_firewall_after_every_exporter_and_before_the_servers() -> None:
    order = [play["ansible.builtin.import_playbook"] for play in load(ROOT / "site.yml")]
    firewall = order.index("playbooks/exporter_firewall.yml")
    for name in EXPORTERS:
        assert order.index(f"playbooks/{name}.yml") < firewall
    # The servers start behind their rules, which come from the inventory alone.
    for role in set(SERVER_ROLES.values()):
        assert order.index(f"playbooks/{role}.yml") > firewall, role
    assert load(ROOT / "playbooks" / "exporter_firewall.yml")[0]["hosts"] == "all"


# --- rendered rules on the example inventory ---------------------------------------------


def rules(host: str, overrides: dict | None = None, inventory=None) -> str:
    groups, hostvars = inventory or example_inventory()
    # As Ansible sets it: the groups the host is in.
    group_names = sorted(g for g, hosts in groups.items() if host in hosts and g != "all")
    variables = {**ENABLED, "group_names": group_names, **(overrides or {})}
    # An inventory variable of the host is in its hostvars too (the exporter ports are
    # read from there, as Prometheus reads them).
    hostvars = {**hostvars, host: {**hostvars[host], **(overrides or {})}}
    return render(ROLE, "exporter-firewall.nft.j2", host, variables, (groups, hostvars))


def elements(text: str, name: str) -> list[str]:
    block = re.search(rf"set {name} \{{\n(.*?)\n\t\}}", text, re.S).group(1)
    found = re.search(r"elements = \{ (.*) \}", block)
    return found.group(1).split(", ") if found else []


@pytest.mark.parametrize(
    ("host", "ports"),
    [
        ("gpu001", ["9100", "9290", "9400"]),  # gpu_collector: dcgm; ipmi on compute nodes
        ("l40s01", ["9100", "9290"]),  # gpu_collector: smi, no exporter of its own
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
    assert elements(text, "exporter_ports") == ["8080", "9200", "9290", "9400"]
    assert elements(text, "allowed_ipv4") == ["10.1.9.1", "10.1.9.2", "192.0.2.0/24"]
    assert elements(text, "allowed_ipv6") == ["2001:db8::5"]
    assert "counter reject with tcp reset" in text


def test_the_slurm_controller_may_query_prometheus() -> None:
    """The job summary epilog runs on the controller and asks every Prometheus instance."""
    text = rules("mon01")
    assert "10.1.9.10" in elements(text, "prometheus_allowed_ipv4")  # slurmctl01
    assert "10.1.9.10" not in elements(text, "allowed_ipv4")  # not the exporters


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


def loaded_in_a_namespace(script: str) -> list[dict]:
    """`nft -j` output of script, run in a throwaway network namespace."""
    run = subprocess.run(
        ["unshare", "--net", "sh", "-c", script], capture_output=True, text=True, timeout=60
    )
    if "Operation not permitted" in run.stderr:
        pytest.skip("no permission to create a network namespace here")
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)["nftables"]


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
    listed = loaded_in_a_namespace(script)
    sets = {item["set"]["name"]: item["set"].get("elem", []) for item in listed if "set" in item}
    assert sets["exporter_ports"] == [9100, 9290, 9400]
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


# --- every gpufleet server: a hand-made inventory ----------------------------------------


def instances(*modes: tuple[str, int | None]) -> list[dict]:
    return [
        {
            "name": mode if shard is None else f"shard-{shard}",
            "mode": mode,
            "shard": shard,
            "replica": 0,
        }
        for mode, shard in modes
    ]


def server_inventory() -> tuple[dict[str, list[str]], dict[str, dict]]:
    """mon01 runs shards 0 and 1, the global tier, an Alertmanager, Loki and
    VictoriaMetrics; mon02 (IPv6 only) the replicas and a second Alertmanager; graf01
    Grafana; GPU nodes with dcgm-exporter; the Slurm controller."""
    hostvars = {
        "mon01": {
            "ansible_host": "10.0.0.1",
            "gpufleet_prometheus_instances": instances(
                ("shard", 0), ("shard", 1), ("global", None)
            ),
        },
        "mon02": {
            "ansible_host": "fd00::2",
            "gpufleet_prometheus_instances": instances(
                ("shard", 0), ("shard", 1), ("global", None)
            ),
        },
        "graf01": {"ansible_host": "10.0.0.5"},
        "gpu01": {"ansible_host": "10.0.1.1"},
        "gpu02": {"ansible_host": "10.0.1.2"},
        "ctl01": {"ansible_host": "10.0.2.1"},
    }
    groups = {
        "all": sorted(hostvars),
        "prometheus": ["mon01", "mon02"],
        "prometheus_global": ["mon01", "mon02"],
        "alertmanager": ["mon01", "mon02"],
        "loki": ["mon01"],
        "victoriametrics": ["mon01"],
        "grafana": ["graf01"],
        "servers": ["mon01", "mon02", "graf01", "ctl01"],
        "gpu_nodes": ["gpu01", "gpu02"],
        "gpu_collector_dcgm": ["gpu01", "gpu02"],
        "slurm_controller": ["ctl01"],
    }
    return groups, hostvars


def group_names(host: str, groups: dict[str, list[str]]) -> list[str]:
    return sorted(g for g, hosts in groups.items() if host in hosts and g != "all")


def rule_list(host: str, overrides: dict | None = None, inventory=None) -> dict[str, dict]:
    """The role's _exporter_firewall_rules for host, by rule name."""
    groups, hostvars = inventory or server_inventory()
    variables = {**ENABLED, "group_names": group_names(host, groups), **(overrides or {})}
    found = evaluate(ROLE, "_exporter_firewall_rules", host, variables, (groups, hostvars))
    assert [rule["name"] for rule in found] == sorted(rule["name"] for rule in found)
    return {rule["name"]: rule for rule in found}


def server_rules(host: str, overrides: dict | None = None) -> str:
    inventory = server_inventory()
    variables = {"group_names": group_names(host, inventory[0]), **(overrides or {})}
    return rules(host, variables, inventory)


MON = ["10.0.0.1"]
MON_V6 = ["fd00::2"]
MON_AND_GRAFANA = ["10.0.0.1", "10.0.0.5"]


def test_a_monitoring_host_protects_every_server_port_with_its_clients() -> None:
    found = rule_list("mon01")
    summary = {
        name: (rule["services"], rule["tcp"], rule["udp"], rule["ipv4"], rule["ipv6"])
        for name, rule in found.items()
    }
    everyone = ["10.0.0.1", "10.0.0.5", "10.0.1.1", "10.0.1.2", "10.0.2.1"]
    assert summary == {
        # Prometheus hosts and Grafana send alerts or read them, and Loki's ruler too.
        "alertmanager": (["alertmanager"], [9093], [], MON_AND_GRAFANA, MON_V6),
        # The Alertmanager peers gossip, over TCP and UDP.
        "alertmanager_gossip": (["alertmanager_gossip"], [9094], [9094], MON, MON_V6),
        # Prometheus scrapes node_exporter as before.
        "exporter": (["node_exporter"], [9100], [], MON, MON_V6),
        # Alloy on every host pushes logs, Grafana queries.
        "loki": (["loki"], [3100], [], everyone, MON_V6),
        "loki_grpc": (["loki_grpc"], [9096], [], MON, []),
        # Global (9090) federates the shards (9091, 9092), replicas, Grafana and the Slurm
        # controller's job summary epilog (ctl01) query.
        "prometheus": (
            ["prometheus"],
            [9090, 9091, 9092],
            [],
            [*MON_AND_GRAFANA, "10.0.2.1"],
            MON_V6,
        ),
        "victoriametrics": (["victoriametrics"], [8428], [], MON_AND_GRAFANA, MON_V6),
    }


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("mon02", ["alertmanager", "alertmanager_gossip", "exporter", "prometheus"]),
        ("graf01", ["exporter"]),  # Grafana's own port is the users': not restricted
        ("gpu01", ["exporter"]),
        ("ctl01", ["exporter"]),
    ],
)
def test_other_hosts_protect_only_the_services_they_run(host: str, expected: list[str]) -> None:
    found = rule_list(host)
    assert sorted(found) == expected
    ports = {"graf01": [9100], "gpu01": [9100, 9400], "ctl01": [9100, 9341]}
    if host in ports:
        assert found["exporter"]["tcp"] == ports[host]
    assert all(3000 not in rule["tcp"] for rule in found.values())


def test_server_ports_follow_their_variables() -> None:
    found = rule_list(
        "mon01",
        {
            "prometheus_port_base": 19090,
            "alertmanager_port": 19093,
            "alertmanager_cluster_port": 19094,
            "loki_http_port": 13100,
            "loki_grpc_port": 19096,
            "victoriametrics_port": 18428,
        },
    )
    assert {name: (rule["tcp"], rule["udp"]) for name, rule in found.items()} == {
        "alertmanager": ([19093], []),
        "alertmanager_gossip": ([19094], [19094]),
        "exporter": ([9100], []),
        "loki": ([13100], []),
        "loki_grpc": ([19096], []),
        "prometheus": ([19090, 19091, 19092], []),
        "victoriametrics": ([18428], []),
    }


def test_admin_sources_reach_server_ports_but_not_exporters() -> None:
    admins = ["192.0.2.0/24", "2001:db8::7"]
    found = rule_list("mon01", {ADMIN: admins})
    for name in ("prometheus", "alertmanager", "loki", "victoriametrics"):
        assert "192.0.2.0/24" in found[name]["ipv4"], name
        assert "2001:db8::7" in found[name]["ipv6"], name
    for name in ("exporter", "alertmanager_gossip", "loki_grpc"):
        assert "192.0.2.0/24" not in found[name]["ipv4"], name
        assert "2001:db8::7" not in found[name]["ipv6"], name
    assert rule_list("gpu01", {ADMIN: admins})["exporter"]["ipv4"] == MON


def test_extra_sources_reach_exporter_ports_only() -> None:
    found = rule_list("mon01", {EXTRA: ["192.0.2.9"], "exporter_firewall_extra_ports": [8080]})
    assert found["exporter"]["ipv4"] == ["10.0.0.1", "192.0.2.9"]
    assert found["exporter"]["tcp"] == [8080, 9100]
    assert found["exporter"]["services"] == ["extra_ports", "node_exporter"]
    for name, rule in found.items():
        if name != "exporter":
            assert "192.0.2.9" not in rule["ipv4"], name


@pytest.mark.parametrize("host", ["mon01", "gpu01"])
@pytest.mark.parametrize("bad", ["admin.example", "10.0.0.5/24", "300.1.1.1"])
def test_a_bad_admin_source_is_refused_on_every_host(host: str, bad: str) -> None:
    with pytest.raises(Exception, match=f"{ADMIN}: '{re.escape(bad)}' is not an IP address"):
        rule_list(host, {ADMIN: [bad]})


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("loki_http_port", 70000),
        ("alertmanager_cluster_port", "gossip"),
        ("prometheus_port_base", 65535),
    ],
)
def test_a_bad_server_port_is_refused_naming_its_variable(variable: str, value) -> None:
    # prometheus_port_base 65535: the shards would listen on 65536 and 65537.
    with pytest.raises(Exception, match=f"{variable}: .* is not a TCP port"):
        rule_list("mon01", {variable: value})


def test_an_extra_port_of_a_server_is_refused_naming_both() -> None:
    with pytest.raises(
        Exception,
        match=r"TCP port 9091 is both exporter_firewall_extra_ports .* prometheus_port_base",
    ):
        rule_list("mon01", {"exporter_firewall_extra_ports": [9091]})


def test_a_node_known_by_name_fails_the_loki_host_with_the_fix() -> None:
    groups, hostvars = server_inventory()
    hostvars["gpu02"] = {"ansible_host": "gpu02.example"}
    with pytest.raises(
        Exception, match=r"sources of the loki rule: gpu02: .*exporter_firewall_source"
    ):
        rule_list("mon01", inventory=(groups, hostvars))
    # The nodes' own exporters do not depend on it ...
    assert rule_list("gpu01", inventory=(groups, hostvars))["exporter"]["ipv4"] == MON
    # ... and the node's source addresses are the fix.
    hostvars["gpu02"]["exporter_firewall_source_addresses"] = ["10.0.1.2"]
    assert "10.0.1.2" in rule_list("mon01", inventory=(groups, hostvars))["loki"]["ipv4"]


def test_a_server_without_remote_clients_allows_loopback_only() -> None:
    """VictoriaMetrics alone in its inventory: nothing to let in but loopback, which the
    preflight accepts; the exporters of such a host, with no Prometheus, fail it."""
    hostvars = {"vm01": {"ansible_host": "10.0.0.9"}}
    inventory = ({"all": ["vm01"], "victoriametrics": ["vm01"]}, hostvars)
    found = rule_list("vm01", {EXTRA: ["10.0.0.1"]}, inventory)
    assert (found["victoriametrics"]["ipv4"], found["victoriametrics"]["ipv6"]) == ([], [])
    assert preflight_unscraped("vm01", {EXTRA: ["10.0.0.1"]}, inventory) == []
    assert [r["name"] for r in preflight_unscraped("vm01", {}, inventory)] == ["exporter"]
    text = rules("vm01", {"group_names": ["victoriametrics"]}, inventory)
    assert elements(text, "victoriametrics_ports") == ["8428"]
    assert elements(text, "victoriametrics_allowed_ipv4") == []
    assert 'chain victoriametrics_access {\n\t\tiifname "lo" accept\n' in text


def preflight_unscraped(host: str, overrides: dict, inventory) -> list:
    """The preflight's list of exporter rules nothing may reach (the assert wants [])."""
    task = load(ROLES / ROLE / "tasks" / "preflight.yml")[0]
    groups = inventory[0]
    variables = {**ENABLED, "group_names": group_names(host, groups), **overrides}
    for name, value in task["vars"].items():
        variables[name] = template_value(ROLE, value, host, variables, inventory)
    assert task["ansible.builtin.assert"]["that"] == ["__exporter_firewall_unscraped | length == 0"]
    return variables["__exporter_firewall_unscraped"]


def test_rendered_server_rules_chain_every_rule() -> None:
    text = server_rules("mon01", {ADMIN: ["192.0.2.0/24"], "exporter_firewall_action": "reject"})
    jumps = [line.strip() for line in text.split("chain input {")[1].split("}")[0].splitlines()]
    assert jumps[2:] == [
        "tcp dport @alertmanager_ports jump alertmanager_access",
        "tcp dport @alertmanager_gossip_ports jump alertmanager_gossip_access",
        "udp dport @alertmanager_gossip_udp_ports jump alertmanager_gossip_access",
        "tcp dport @exporter_ports jump exporter_access",
        "tcp dport @loki_ports jump loki_access",
        "tcp dport @loki_grpc_ports jump loki_grpc_access",
        "tcp dport @prometheus_ports jump prometheus_access",
        "tcp dport @victoriametrics_ports jump victoriametrics_access",
        "",
    ]
    assert elements(text, "prometheus_ports") == ["9090", "9091", "9092"]
    assert elements(text, "prometheus_allowed_ipv4") == [
        "10.0.0.1",
        "10.0.0.5",
        "10.0.2.1",  # ctl01, the job summary epilog
        "192.0.2.0/24",
    ]
    assert elements(text, "alertmanager_gossip_udp_ports") == ["9094"]
    # A TCP reset cannot answer UDP: gossip rejects UDP with an ICMP port unreachable.
    gossip = text.split("chain alertmanager_gossip_access {")[1].split("}")[0]
    assert [line.strip() for line in gossip.strip().splitlines()[-2:]] == [
        "meta l4proto tcp counter reject with tcp reset",
        "counter reject",
    ]
    loki = text.split("chain loki_access {")[1].split("}")[0]
    assert loki.splitlines()[-2].strip() == "counter reject with tcp reset"


@pytest.mark.skipif(not nft_allowed(), reason="needs nft and root")
@pytest.mark.parametrize("action", ["drop", "reject"])
def test_rendered_server_rules_pass_nft(action: str, tmp_path: Path) -> None:
    path = tmp_path / "rules.nft"
    path.write_text(
        server_rules(
            "mon01", {"exporter_firewall_action": action, ADMIN: ["192.0.2.0/24", "2001:db8::/48"]}
        )
    )
    script = f"nft -c -f {path} && nft -f {path} && nft -j list table inet gpufleet_exporters"
    listed = loaded_in_a_namespace(script)
    sets = {item["set"]["name"]: item["set"].get("elem", []) for item in listed if "set" in item}
    assert sets["prometheus_ports"] == [9090, 9091, 9092]
    assert sets["alertmanager_gossip_udp_ports"] == [9094]
    assert sets["loki_grpc_allowed_ipv4"] == ["10.0.0.1"]
    assert sets["loki_grpc_allowed_ipv6"] == []
    assert sets["victoriametrics_allowed_ipv6"] == [
        {"prefix": {"addr": "2001:db8::", "len": 48}},
        "fd00::2",
    ]
    chains = [item["chain"]["name"] for item in listed if "chain" in item]
    assert chains == [
        "input",
        "alertmanager_access",
        "alertmanager_gossip_access",
        "exporter_access",
        "loki_access",
        "loki_grpc_access",
        "prometheus_access",
        "victoriametrics_access",
    ]


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze not installed")
def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    text = render(ROLE, "gpufleet-exporter-firewall.service.j2", "cpu01", ENABLED)
    assert "ExecReload=/usr/sbin/nft -f /etc/gpufleet/exporter-firewall.nft" in text
    assert "ExecStart=/usr/sbin/nft -f /etc/gpufleet/exporter-firewall.nft" in text
    unit = tmp_path / "gpufleet-exporter-firewall.service"
    unit.write_text(re.sub(r"(Exec\w+=)/usr/sbin/nft", r"\1/bin/true", text))
    assert not systemd_verify_problems(unit)
