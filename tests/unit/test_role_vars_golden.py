"""The prometheus and exporter_firewall roles' data variables, against their golden values.

The variables that build data from the registry and the inventory (_prometheus_jobs,
_prometheus_targets, _exporter_firewall_exporters, the servers' port lists, the rules):
tests/golden/role-vars.json holds their values for the hand-made inventory below, with
the real and an extended exporter registry, including edge cases the example inventory
lacks (port overrides as text and as null, an IPv6 host, a host without ansible_host, an
empty group, a group the inventory lacks, a duplicated group member, duplicated ports, a
role named twice, modes as one string, metrics paths). The values must stay exactly
these, down to the order of keys and lists, and so must each error: they are what the
roles' Jinja loops and filter chains gave before those became filter calls into
src/gpufleet (scrape_targets, firewall).

What runs for real: the roles' vars rendered by Ansible's own Templar (render_role).
To regenerate the file after an intended change: python tests/unit/test_role_vars_golden.py
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.plugins.loader import filter_loader
from render_role import ROLES, ROOT, evaluate

filter_loader.add_directory(str(ROOT / "plugins" / "filter"))

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "role-vars.json"

REGISTRY = yaml.safe_load((ROLES / "_exporters" / "defaults" / "main.yml").read_text())[
    "exporters_registry"
]
# Entries only this test has: the extended registry.
EXTRA = {
    # A sharded exporter of a group the inventory lacks, scraped by shards only (modes
    # a string: Jinja's `contains` is `in`), on a port the exporter rule has already.
    "fake": {
        "role": "fake_exporter",
        "group": "fake_nodes",
        "port_variable": "fake_exporter_port",
        "port": 9100,
        "modes": "shard",
        "sharded": True,
        "firewall": True,
    },
    # A second entry of an exporter role: the firewall keeps the later one.
    "node_again": {
        "role": "node_exporter",
        "group": "gpu_nodes",
        "port_variable": "node_again_port",
        "port": 9101,
        "modes": ["standalone"],
        "sharded": False,
        "firewall": True,
    },
    # Several endpoints of every host of an empty group and of a duplicated one.
    "paths_empty": {
        "served_by": "nothing",
        "group": "victoriametrics",
        "port_variable": "paths_port",
        "port": 7000,
        "modes": ["standalone", "global"],
        "sharded": False,
        "firewall": False,
        "metrics_paths": ["/a", "/b"],
    },
    "paths_dup": {
        "served_by": "something",
        "group": "slurm_controller",
        "port_variable": "paths_port",
        "port": 7000,
        "modes": ["standalone", "global"],
        "sharded": True,
        "firewall": False,
        "metrics_paths": ["/a"],
    },
}
REGISTRIES = {"real": REGISTRY, "extended": {**REGISTRY, **EXTRA}}

GROUPS: dict[str, list[str]] = {
    "all": ["gpu1", "gpu2", "gpu3", "v6gpu", "cpu1", "mon1", "mon2", "ctl1"],
    "gpu_nodes": ["gpu1", "gpu2", "gpu3", "v6gpu"],
    "gpu_collector_dcgm": ["gpu1", "gpu2", "v6gpu"],
    "ipmi_exporter": ["gpu3", "gpu1", "cpu1"],
    "prometheus": ["mon1", "mon2"],
    "prometheus_global": ["mon1"],
    "alertmanager": ["mon1", "mon2"],
    "grafana": ["mon2"],
    "loki": ["mon2"],
    "victoriametrics": [],
    # Never so in Ansible, but a sharded entry deduplicates and another does not.
    "slurm_controller": ["ctl1", "ctl1"],
    "slurmctld_metrics": ["ctl1"],
    "prometheus_shard_0": ["gpu1", "gpu2", "mon1", "ctl1"],
    "prometheus_shard_1": ["gpu3", "v6gpu", "cpu1", "mon2"],
}
INSTANCES = {
    "mon1": [
        {"name": "global", "mode": "global", "shard": None, "replica": 0},
        {"name": "shard0-r0", "mode": "shard", "shard": 0, "replica": 0},
    ],
    "mon2": [
        {"name": "shard1-r0", "mode": "shard", "shard": 1, "replica": 0},
        {"name": "shard0-r1", "mode": "shard", "shard": 0, "replica": 1},
    ],
}
HOSTVARS: dict[str, dict[str, Any]] = {
    "gpu1": {"ansible_host": "10.0.0.1", "node_exporter_port": "9200"},
    "gpu2": {"ansible_host": "10.0.0.2", "dcgm_exporter_port": 9401, "node_again_port": 9102},
    # An override to null: targets take the default, the firewall refuses it.
    "gpu3": {"ansible_host": "10.0.0.3", "ipmi_exporter_port": None},
    "v6gpu": {"ansible_host": "2001:db8::10", "fake_exporter_port": 9300},
    # No ansible_host: scraped by name, a firewall source by its own addresses.
    "cpu1": {"exporter_firewall_source_addresses": ["10.0.1.0/24", "fd00::1"]},
    "mon1": {
        "ansible_host": "10.0.9.1",
        "gpufleet_prometheus_instances": INSTANCES["mon1"],
        "prometheus_port_base": "9190",
        "alertmanager_port": 9393,
        "exporter_firewall_admin_sources": ["192.0.2.1", "2001:db8:1::/64"],
    },
    "mon2": {
        "ansible_host": "10.0.9.2",
        "gpufleet_prometheus_instances": INSTANCES["mon2"],
        "exporter_firewall_extra_ports": ["9998", 9998, 9997],
        "exporter_firewall_extra_sources": ["10.9.0.0/16", "10.9.1.0/24"],
        "loki_http_port": 3101,
    },
    "ctl1": {"ansible_host": "10.0.8.1", "slurm_exporter_port": 9342},
}
for _name, _vars in HOSTVARS.items():
    _vars.setdefault("gpufleet_target_labels", {"cluster": "t", "rack": f"r-{_name}"})

# Every kind of instance, and a shard the inventory has no group for.
TARGET_INSTANCES = [
    {"name": "standalone", "mode": "standalone", "shard": None, "replica": 0},
    {"name": "global", "mode": "global", "shard": None, "replica": 0},
    {"name": "shard0-r0", "mode": "shard", "shard": 0, "replica": 0},
    {"name": "shard1-r1", "mode": "shard", "shard": 1, "replica": 1},
    {"name": "shard7-r0", "mode": "shard", "shard": 7, "replica": 0},
]
# _exporter_firewall_services is these combined; the servers do not read the registry.
FIREWALL_VARIABLES = {
    "real": [
        "_exporter_firewall_exporters",
        "_exporter_firewall_servers",
        "_exporter_firewall_rules",
    ],
    "extended": ["_exporter_firewall_exporters", "_exporter_firewall_rules"],
}


def _value(role: str, name: str, host: str, overrides: dict) -> Any:
    """The variable's value, or {"error": the filter's own message} when it fails."""
    inventory = (copy.deepcopy(GROUPS), copy.deepcopy(HOSTVARS))
    try:
        return evaluate(role, name, host, overrides, inventory)
    except Exception as err:  # what Ansible reports wraps the filter's exception
        while err.__cause__ is not None:
            err = err.__cause__  # type: ignore[assignment]
        return {"error": str(err)}


def _cases() -> dict[str, tuple[str, str, str, dict[str, Any]]]:
    """Every golden value's case: {name: (role, variable, host, overrides)}."""
    out = {}
    for key, registry in REGISTRIES.items():
        given = {"exporters_registry": registry}
        out[f"{key} _prometheus_jobs"] = ("prometheus", "_prometheus_jobs", "mon1", given)
        for instance in TARGET_INSTANCES:
            out[f"{key} _prometheus_targets {instance['name']}"] = (
                "prometheus",
                "_prometheus_targets",
                "mon1",
                {**given, "_instance": instance},
            )
        for host in GROUPS["all"]:
            names = sorted(g for g, hosts in GROUPS.items() if host in hosts and g != "all")
            for name in FIREWALL_VARIABLES[key]:
                out[f"{key} {name} {host}"] = (
                    "exporter_firewall",
                    name,
                    host,
                    {**given, "group_names": names},
                )
    return out


CASES = _cases()


def current() -> dict[str, Any]:
    """Every golden value as the roles give it now: {case: value}."""
    return {case: _value(*args) for case, args in CASES.items()}


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text())


def test_every_case_has_a_golden_value(golden: dict[str, Any]) -> None:
    assert list(CASES) == list(golden)


@pytest.mark.parametrize("case", list(CASES))
def test_the_value_is_the_golden_one(case: str, golden: dict[str, Any]) -> None:
    # Through JSON, as the golden file: order of keys and lists included.
    now = json.dumps(_value(*CASES[case]), indent=1)
    assert now == json.dumps(golden[case], indent=1)


def test_the_golden_values_cover_the_edge_cases(golden: dict[str, Any]) -> None:
    errors = sorted(case for case, value in golden.items() if "error" in value)
    # gpu3's null port: the firewall refuses it, the scrape falls back to the default.
    assert errors == [
        "extended _exporter_firewall_rules gpu3",
        "real _exporter_firewall_rules gpu3",
    ]
    assert "ipmi_exporter_port: None" in golden["real _exporter_firewall_rules gpu3"]["error"]
    ipmi = golden["real _prometheus_targets standalone"]["ipmi"]
    assert [g["targets"] for g in ipmi] == [["cpu1:9290"], ["10.0.0.1:9290"], ["10.0.0.3:9290"]]
    node = golden["real _prometheus_targets shard1-r1"]["node"]
    assert ["[2001:db8::10]:9100"] in [g["targets"] for g in node]
    # The duplicated controller: once for the sharded entry, twice for the other.
    standalone = golden["extended _prometheus_targets standalone"]
    assert (len(standalone["slurm"]), len(standalone["paths_dup"])) == (2, 1)
    assert golden["extended _prometheus_targets global"]["paths_dup"] == []
    assert golden["extended _prometheus_targets global"]["paths_empty"] == []


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(current(), indent=1) + "\n")
    sys.exit(0)
