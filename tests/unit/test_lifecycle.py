"""gpufleet.lifecycle: a node leaving (playbooks/remove_node.yml). Which hosts leave and
what is refused, who stays, the shard lock without them; and that the file_sd targets,
the firewall sources, the Slurm exporter's node map and the inventory's lock variable
follow a host marked gpufleet_leaving as they follow its removal from the node list."""

from __future__ import annotations

import sys
from ipaddress import ip_address, ip_network
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet import firewall, lifecycle
from gpufleet.inventory import build_inventory
from gpufleet.nodelist import parse_node_list
from gpufleet.scrape_targets import node_shards, registry_targets
from gpufleet.shardlock import LockError, format_lock, parse_lock

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "plugins" / "filter"))
import gpufleet_filters  # noqa: E402

GROUPS: dict[str, list[str]] = {
    "all": ["gpu001", "gpu002", "gpu003", "gpu010", "mon01", "login01"],
    "gpu_nodes": ["gpu001", "gpu002", "gpu003", "gpu010"],
    "prometheus": ["mon01"],
    "alertmanager": ["mon01"],
    "loki": ["login01"],
    "prometheus_shard_0": ["gpu001", "gpu003", "mon01"],
    "prometheus_shard_1": ["gpu002", "gpu010", "login01"],
}


def leaving(spec: object, groups: dict[str, list[str]] = GROUPS) -> lifecycle.Leaving:
    return lifecycle.leaving_hosts(spec, groups)


@pytest.mark.parametrize(
    ("spec", "hosts"),
    [
        ("gpu002", ["gpu002"]),
        ("gpu[002-003]", ["gpu002", "gpu003"]),
        ("gpu[001,010],gpu002", ["gpu001", "gpu010", "gpu002"]),
        (["gpu003", "gpu[001-002]"], ["gpu003", "gpu001", "gpu002"]),
        (" gpu002 ", ["gpu002"]),
        ("gpu002,gpu002", ["gpu002"]),
    ],
)
def test_a_hostlist_names_the_leaving_hosts(spec: object, hosts: list[str]) -> None:
    assert leaving(spec) == {"hosts": hosts, "problem": ""}


@pytest.mark.parametrize("spec", [None, "", [], [""], " "])
def test_no_name_is_refused_with_the_usage(spec: object) -> None:
    found = leaving(spec)
    assert found["hosts"] == []
    assert "gpufleet_remove_nodes" in found["problem"]
    assert "\n" not in found["problem"]


def test_a_name_not_in_the_inventory_is_refused_and_nothing_leaves() -> None:
    found = leaving("gpu[002-005]")
    assert found["hosts"] == []
    assert found["problem"] == (
        "gpufleet_remove_nodes: not in the inventory: gpu[004-005] (2 of 4 names); "
        "nothing was changed"
    )


@pytest.mark.parametrize("group", lifecycle.SERVER_GROUPS)
def test_a_monitoring_server_is_refused(group: str) -> None:
    groups = {**GROUPS, group: ["gpu010"]}
    found = leaving("gpu[002,010]", groups)
    assert found["hosts"] == []
    assert found["problem"].startswith(
        f"gpufleet_remove_nodes: gpu010 is a monitoring server (group {group}): "
    )
    assert "\n" not in found["problem"]


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("gpu[002-", "gpufleet_remove_nodes: unclosed '['"),
        (5, "gpufleet_remove_nodes: expected a hostlist such as 'gpu[007-008]'"),
        (["gpu001", 5], "gpufleet_remove_nodes: expected host names, got int"),
        ("gpu[1-99999999]", "gpufleet_remove_nodes: 'gpu[1-99999999]' expands to more than"),
    ],
)
def test_a_malformed_name_is_refused_in_one_line(spec: object, problem: str) -> None:
    found = leaving(spec)
    assert found["hosts"] == []
    assert found["problem"].startswith(problem), found["problem"]


HOSTVARS: dict[str, dict[str, Any]] = {
    name: {"ansible_host": f"10.0.0.{index}", "gpufleet_target_labels": {"cluster": "c"}}
    for index, name in enumerate(GROUPS["all"], start=1)
}


def marked(*names: str, value: object = True) -> dict[str, dict[str, Any]]:
    return {
        name: {**host, **({"gpufleet_leaving": value} if name in names else {})}
        for name, host in HOSTVARS.items()
    }


@pytest.mark.parametrize(
    ("value", "leaves"),
    [(True, True), ("true", True), ("yes", True), (False, False), ("false", False), (None, False)],
)
def test_the_mark_is_a_boolean(value: object, leaves: bool) -> None:
    assert lifecycle.is_leaving({"gpufleet_leaving": value}) is leaves
    assert lifecycle.is_leaving({}) is False
    assert lifecycle.is_leaving(None) is False


def test_staying_and_groups_staying_drop_the_marked_hosts_only() -> None:
    hostvars = marked("gpu002", "gpu010")
    assert lifecycle.staying(GROUPS["all"], hostvars) == ["gpu001", "gpu003", "mon01", "login01"]
    staying = lifecycle.groups_staying(GROUPS, hostvars)
    assert staying["prometheus_shard_1"] == ["login01"]
    assert staying["prometheus_shard_0"] == GROUPS["prometheus_shard_0"]
    assert lifecycle.groups_staying(GROUPS, HOSTVARS) == GROUPS
    # The filters are the same functions.
    assert gpufleet_filters.gpufleet_groups_staying(GROUPS, hostvars) == staying


def without(name: str) -> tuple[dict[str, list[str]], dict[str, dict[str, Any]]]:
    """The inventory once the node list no longer has name."""
    groups = {group: [h for h in hosts if h != name] for group, hosts in GROUPS.items()}
    return groups, {host: v for host, v in HOSTVARS.items() if host != name}


REGISTRY = {
    "node": {"group": "all", "port_variable": "node_exporter_port", "port": 9100,
             "modes": ["standalone", "shard"], "sharded": True, "firewall": True},
    "ipmi": {"group": "gpu_nodes", "port_variable": "ipmi_exporter_port", "port": 9290,
             "modes": ["standalone", "shard"], "sharded": True, "firewall": True},
}  # fmt: skip


@pytest.mark.parametrize("scraped", [GROUPS["all"], GROUPS["prometheus_shard_1"]])
def test_targets_of_a_marked_host_are_those_after_its_removal(scraped: list[str]) -> None:
    groups, hostvars = without("gpu002")
    assert registry_targets(REGISTRY, GROUPS, marked("gpu002"), scraped) == registry_targets(
        REGISTRY, groups, hostvars, [h for h in scraped if h != "gpu002"]
    )
    assert "10.0.0.2:9100" not in str(registry_targets(REGISTRY, GROUPS, marked("gpu002"), scraped))


def test_firewall_sources_of_a_marked_host_are_those_after_its_removal() -> None:
    services = {
        "loki": {"group": "loki", "tcp": {"loki_http_port": 3100}, "source_groups": ["all"]}
    }
    groups, hostvars = without("gpu002")
    before = firewall.rules(services, ["loki"], GROUPS, HOSTVARS)
    after = firewall.rules(services, ["loki"], GROUPS, marked("gpu002"))

    def admits(rules: list[dict[str, Any]], address: str) -> bool:
        return any(ip_address(address) in ip_network(net) for net in rules[0]["ipv4"])

    assert admits(before, "10.0.0.2")
    assert after == firewall.rules(services, ["loki"], groups, hostvars)
    assert not admits(after, "10.0.0.2")
    assert admits(after, "10.0.0.3")


def test_the_slurm_node_map_of_a_marked_host_is_that_after_its_removal() -> None:
    staying = gpufleet_filters.gpufleet_groups_staying(GROUPS, marked("gpu002"))
    groups, _ = without("gpu002")
    assert node_shards(staying) == node_shards(groups)


def test_the_lock_loses_the_leaving_hosts_and_keeps_the_rest() -> None:
    text = format_lock("hpc-a", 2, {"gpu001": 0, "gpu002": 1, "gpu003": 0, "mon01": 1})
    new = lifecycle.lock_without(text, "x.lock", ["gpu002", "gpu003", "gpu999"])
    lock = parse_lock(new, "x.lock")
    assert (lock.cluster, lock.shards, dict(lock.hosts)) == ("hpc-a", 2, {"gpu001": 0, "mon01": 1})
    # What gpufleet plan --write-lock writes once the node list has no gpu002 and gpu003.
    assert new == format_lock("hpc-a", 2, {"gpu001": 0, "mon01": 1})
    # Nothing to remove: the text as it was, byte for byte (a hand-kept comment stays).
    kept = "# a site comment\n" + new
    assert lifecycle.lock_without(kept, "x.lock", ["gpu002"]) == kept


def test_a_malformed_lock_is_refused_by_the_filter_in_one_line() -> None:
    with pytest.raises(LockError):
        lifecycle.lock_without("version: 2\n", "x.lock", ["gpu001"])
    found = gpufleet_filters.gpufleet_lock_without("version: 2\n", "/srv/x.lock", ["gpu001"])
    assert found["text"] == ""
    assert found["problem"].startswith("/srv/x.lock: ")
    assert "\n" not in found["problem"]


def test_the_inventory_names_the_lock_file_only_when_one_is_configured(tmp_path: Path) -> None:
    data: dict[str, Any] = {
        "plugin": "gpufleet",
        "cluster": "c",
        "nodes": [{"hosts": "gpu[001-002]"}],
        "servers": [{"hosts": "mon01"}],
        "monitoring": {"prometheus_hosts": "mon01"},
    }
    path = str(tmp_path / "nodes.gpufleet.yml")
    plain = build_inventory(parse_node_list(yaml.safe_load(yaml.safe_dump(data)), path))
    assert "gpufleet_shard_lock" not in plain.group_vars["all"]
    data["monitoring"]["shard_lock"] = ".shards.lock"
    locked = build_inventory(parse_node_list(data, path))
    assert locked.group_vars["all"]["gpufleet_shard_lock"] == str(tmp_path / ".shards.lock")
