"""gpufleet.firewall.exporter_services and gpufleet.inventory.prometheus_ports: the
exporter_firewall role's services of the registry's exporters and the ports of a host's
Prometheus instances (the filters gpufleet_firewall_exporters and
gpufleet_prometheus_ports). Pure functions on hand-made registries and host variables;
tests/unit/test_role_vars_golden.py checks the role's variables that call them."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.firewall import exporter_services, rules
from gpufleet.inventory import prometheus_ports


def entry(**given: Any) -> dict[str, Any]:
    return {
        "role": "node_exporter",
        "group": "all",
        "port_variable": "node_exporter_port",
        "port": 9100,
        "firewall": True,
        **given,
    }


SOURCES = {
    "source_groups": ["prometheus", "prometheus_global"],
    "source_variables": ["exporter_firewall_extra_sources"],
}


def test_each_firewalled_exporter_is_a_service_of_the_exporter_rule() -> None:
    registry = {
        "node": entry(),
        "am": entry(role="alertmanager", firewall=False),
        "ipmi": entry(role="ipmi_exporter", group="ipmi", port_variable="ipmi_port", port=9290),
    }
    assert exporter_services(registry, {}) == {
        "node_exporter": {
            "rule": "exporter",
            "group": "all",
            "tcp": {"node_exporter_port": 9100},
            **SOURCES,
        },
        "ipmi_exporter": {
            "rule": "exporter",
            "group": "ipmi",
            "tcp": {"ipmi_port": 9290},
            **SOURCES,
        },
    }


@pytest.mark.parametrize("value", [9102, "9102", None, [9102, 9103]])
def test_the_hosts_own_port_variable_is_taken_as_it_is(value: object) -> None:
    # Checked by rules (a null port is refused there, naming the variable).
    (service,) = exporter_services({"node": entry()}, {"node_exporter_port": value}).values()
    assert service["tcp"] == {"node_exporter_port": value}


def test_a_null_port_is_refused_by_the_rules_naming_its_variable() -> None:
    services = exporter_services({"node": entry()}, {"node_exporter_port": None})
    with pytest.raises(ValueError, match="node_exporter_port: None is not a TCP port"):
        rules(services, ["all"], {}, {}, {"exporter_firewall_extra_sources": []})


def test_an_empty_registry_has_no_services() -> None:
    assert exporter_services({}, {"node_exporter_port": 1}) == {}


def test_a_role_named_twice_is_one_service_the_later_entrys() -> None:
    registry = {"a": entry(), "b": entry(group="gpus", port_variable="other_port", port=9101)}
    services = exporter_services(registry, {})
    assert list(services) == ["node_exporter"]
    assert (services["node_exporter"]["group"], services["node_exporter"]["tcp"]) == (
        "gpus",
        {"other_port": 9101},
    )


def test_each_service_has_lists_of_its_own() -> None:
    registry = {"a": entry(), "b": entry(role="other")}
    first, second = exporter_services(registry, {}).values()
    first["source_groups"].append("grafana")
    assert second["source_groups"] == ["prometheus", "prometheus_global"]


def test_exporters_sharing_a_port_share_the_exporter_rule() -> None:
    registry = {"a": entry(), "b": entry(role="other", port_variable="other_port")}
    hostvars = {"mon": {"ansible_host": "10.0.9.1"}}
    services = exporter_services(registry, {})
    lists = {"exporter_firewall_extra_sources": []}
    (rule,) = rules(services, ["all"], {"prometheus": ["mon"]}, hostvars, lists)
    assert (rule["services"], rule["tcp"], rule["ipv4"]) == (
        ["node_exporter", "other"],
        [9100],
        ["10.0.9.1"],
    )


@pytest.mark.parametrize("key", ["firewall", "role", "group", "port_variable", "port"])
def test_an_entry_without_a_key_is_refused_by_name(key: str) -> None:
    broken = entry()
    del broken[key]
    with pytest.raises(ValueError, match=rf"exporters_registry\.node has no {key}"):
        exporter_services({"node": broken}, {})


def test_a_non_firewalled_entry_needs_no_role() -> None:
    # The registry's endpoints a site's own daemon serves (served_by) have no role.
    served = {"served_by": "slurmctld", "firewall": False, "group": "x"}
    assert exporter_services({"slurmctld": served}, {}) == {}


# --- prometheus_ports ----------------------------------------------------------------------


def test_prometheus_ports_follow_the_instances_in_their_order() -> None:
    instances = [
        {"mode": "shard", "shard": 1},
        {"mode": "global", "shard": None},
        {"mode": "shard", "shard": "0"},
        {"mode": "standalone"},
    ]
    assert prometheus_ports(instances, 9090) == [9092, 9090, 9091, 9090]
    assert prometheus_ports(instances, "9190") == [9192, 9190, 9191, 9190]


def test_no_instances_have_no_ports() -> None:
    assert prometheus_ports([], 9090) == []
