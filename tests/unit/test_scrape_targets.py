"""gpufleet.scrape_targets: the prometheus role's jobs and file_sd targets, from the
exporter registry and the inventory (the filters gpufleet_mode_jobs and
gpufleet_registry_targets). Pure functions on hand-made registries and inventories;
tests/unit/test_role_vars_golden.py checks the role's variables that call them."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.scrape_targets import (
    host_port,
    metrics_paths,
    mode_jobs,
    prometheus_urls,
    registry_targets,
    targets,
)


def entry(**given: Any) -> dict[str, Any]:
    """A registry entry: a sharded node exporter unless given says otherwise."""
    return {
        "group": "all",
        "port_variable": "node_exporter_port",
        "port": 9100,
        "modes": ["standalone", "shard"],
        "sharded": True,
        **given,
    }


HOSTVARS: dict[str, dict[str, Any]] = {
    "a": {"ansible_host": "10.0.0.1", "gpufleet_target_labels": {"rack": "r1"}},
    "b": {"ansible_host": "10.0.0.2", "node_exporter_port": "9200"},
    "c": {"ansible_host": "fd00::3", "node_exporter_port": None},
    "d": {},
}
GROUPS = {"all": ["a", "b", "c", "d"], "ctl": ["d", "d"], "empty": []}


def addresses(found: list[Any]) -> list[str]:
    return [address for group in found for address in group["targets"]]


# --- mode_jobs ------------------------------------------------------------------------------


def test_every_mode_has_its_jobs_in_the_registrys_order() -> None:
    registry = {
        "node": entry(),
        "am": entry(modes=["global", "standalone"]),
        "only": entry(modes="shard"),  # a string: `in`, as Jinja's `contains`
    }
    assert mode_jobs(registry) == {
        "standalone": ["node", "am"],
        "shard": ["node", "only"],
        "global": ["am"],
    }
    assert list(mode_jobs(registry)) == ["standalone", "shard", "global"]


def test_an_empty_registry_has_no_jobs() -> None:
    assert mode_jobs({}) == {"standalone": [], "shard": [], "global": []}


def test_an_entry_without_modes_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"exporters_registry\.node has no modes"):
        mode_jobs({"node": {"group": "all"}})


# --- registry_targets ---------------------------------------------------------------------


def test_a_sharded_exporter_is_scraped_on_the_instances_hosts_only() -> None:
    found = registry_targets({"node": entry()}, GROUPS, HOSTVARS, ["b", "a", "z"])
    assert addresses(found["node"]) == ["10.0.0.1:9100", "10.0.0.2:9200"]


def test_another_is_scraped_on_every_host_of_its_group() -> None:
    registry = {"slurm": entry(group="all", sharded=False)}
    found = registry_targets(registry, GROUPS, HOSTVARS, [])
    assert addresses(found["slurm"]) == [
        "10.0.0.1:9100",
        "10.0.0.2:9200",
        "[fd00::3]:9100",  # IPv6 in brackets; a null port is the default
        "d:9100",  # no ansible_host: by name
    ]


def test_a_group_member_twice_is_one_target_only_where_sharded() -> None:
    registry = {
        "sharded": entry(group="ctl"),
        "plain": entry(group="ctl", sharded=False),
    }
    found = registry_targets(registry, GROUPS, HOSTVARS, ["d"])
    assert addresses(found["sharded"]) == ["d:9100"]
    assert addresses(found["plain"]) == ["d:9100", "d:9100"]


@pytest.mark.parametrize("group", ["empty", "missing"])
def test_an_empty_or_missing_group_has_no_targets(group: str) -> None:
    registry = {"x": entry(group=group), "y": entry(group=group, sharded=False)}
    assert registry_targets(registry, GROUPS, HOSTVARS, GROUPS["all"]) == {"x": [], "y": []}


def test_no_scraped_hosts_leave_a_sharded_exporter_without_targets() -> None:
    assert registry_targets({"node": entry()}, GROUPS, HOSTVARS, []) == {"node": []}


def test_every_job_has_an_entry_in_the_registrys_order() -> None:
    registry = {"z": entry(group="empty"), "a": entry(sharded=False), "m": entry()}
    assert list(registry_targets(registry, GROUPS, HOSTVARS, ["a"])) == ["z", "a", "m"]


def test_labels_are_the_inventorys_plus_node() -> None:
    (group,) = registry_targets({"node": entry()}, GROUPS, HOSTVARS, ["a"])["node"]
    assert group == {"targets": ["10.0.0.1:9100"], "labels": {"rack": "r1", "node": "a"}}


def test_metrics_paths_make_one_group_per_host_and_path() -> None:
    registry = {"ctld": entry(group="all", sharded=False, metrics_paths=["/x", "/y"])}
    found = registry_targets(registry, {"all": ["a", "d"]}, HOSTVARS, [])["ctld"]
    assert [(g["labels"]["node"], g["labels"]["__metrics_path__"]) for g in found] == [
        ("a", "/x"),
        ("a", "/y"),
        ("d", "/x"),
        ("d", "/y"),
    ]
    assert all(g["labels"]["metrics_path"] == g["labels"]["__metrics_path__"] for g in found)


def test_a_bad_port_names_the_host() -> None:
    hostvars = {"a": {"node_exporter_port": "http"}}
    with pytest.raises(ValueError, match="host a: port 'http' is not a TCP port"):
        registry_targets({"node": entry()}, {"all": ["a"]}, hostvars, ["a"])


@pytest.mark.parametrize("key", ["group", "sharded", "port", "port_variable"])
def test_an_entry_without_a_key_is_refused_by_name(key: str) -> None:
    broken = entry()
    del broken[key]
    with pytest.raises(ValueError, match=rf"exporters_registry\.node has no {key}"):
        registry_targets({"node": broken}, GROUPS, HOSTVARS, ["a"])


# --- the helpers ------------------------------------------------------------------------


def test_host_port_brackets_ipv6_only() -> None:
    assert host_port("10.0.0.1", 1) == "10.0.0.1:1"
    assert host_port("fd00::1", 2) == "[fd00::1]:2"
    assert host_port("gpu001", 3) == "gpu001:3"


def test_targets_of_no_hosts_are_none() -> None:
    assert targets([], {}, 9100, "node_exporter_port") == []


def test_metrics_paths_without_paths_are_the_groups_themselves() -> None:
    groups = targets(["a"], HOSTVARS, 9100)
    assert metrics_paths(groups, None) is groups
    assert metrics_paths(groups, []) is groups


def test_prometheus_urls_list_each_instances_replicas_in_order():
    shard = {"mode": "shard", "shard": 0, "name": "shard-0"}
    hostvars = {
        "mon02": {
            "ansible_host": "fd00::2",
            "gpufleet_prometheus_instances": [{**shard, "replica": 1}],
        },
        "mon01": {
            "ansible_host": "10.0.0.1",
            "prometheus_port_base": 9200,
            "gpufleet_prometheus_instances": [
                {**shard, "replica": 0},
                {"mode": "global", "name": "global", "replica": 0},
            ],
        },
    }
    assert prometheus_urls(["mon02", "mon01"], hostvars) == [
        {"name": "shard-0", "urls": ["http://10.0.0.1:9201", "http://[fd00::2]:9091"]}
    ]
    # The hosts' TLS settings give the scheme; the global tier holds no per-job series.
    for host in hostvars.values():
        host["prometheus_tls_cert"] = "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n"
    assert prometheus_urls(["mon01", "mon02"], hostvars)[0]["urls"][0] == "https://10.0.0.1:9201"
    assert prometheus_urls([], {}) == []
