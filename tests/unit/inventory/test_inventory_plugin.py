"""The Ansible adapter: real InventoryData, the real plugin loader, Constructable options."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ansible.errors import AnsibleParserError
from ansible.inventory.data import InventoryData
from ansible.parsing.dataloader import DataLoader
from inventory_helpers import minimal_node_list, write_node_list

from gpufleet.inventory import build_inventory
from gpufleet.nodelist import parse_node_list


def parse(plugin, path: Path) -> InventoryData:
    inventory = InventoryData()
    plugin.parse(inventory, DataLoader(), str(path), cache=False)
    return inventory


def host_vars(inventory: InventoryData, host: str) -> dict[str, Any]:
    return inventory.get_host(host).get_vars()


# -- (b) component: _populate into a real InventoryData ---------------------------------------


def test_populate_adds_groups_hosts_and_vars(plugin) -> None:
    data = minimal_node_list()
    plan = build_inventory(parse_node_list(data, "t.gpufleet.yml"))
    plugin.inventory = InventoryData()
    plugin.set_options(direct=data)
    plugin._populate(plan)
    inventory = plugin.inventory
    assert {h.name for h in inventory.groups["gpu_nodes"].get_hosts()} == {
        "gpu001", "gpu002", "gpu003", "gpu004",
    }  # fmt: skip
    assert inventory.groups["all"].get_vars()["gpufleet_shards"] == 2
    assert host_vars(inventory, "gpu002")["ansible_host"] == "10.0.0.2"
    assert inventory.groups["prometheus_global"].get_hosts()[0].name == "mon01"


# -- (c) in process through the loader --------------------------------------------------------


def test_verify_file_accepts_only_gpufleet_yaml(plugin, tmp_path: Path) -> None:
    for name, expected in [
        ("nodes.gpufleet.yml", True),
        ("prod.gpufleet.yaml", True),
        ("nodes.yml", False),
        ("gpufleet.yml.bak", False),
    ]:
        path = tmp_path / name
        path.write_text("plugin: gpufleet\n")
        assert plugin.verify_file(str(path)) is expected, name


def test_parse_builds_the_inventory(plugin, node_list_path: Path) -> None:
    inventory = parse(plugin, node_list_path)
    assert set(inventory.hosts) == {
        "gpu001",
        "gpu002",
        "gpu003",
        "gpu004",
        "cpu1",
        "cpu2",
        "mon01",
        "mon02",
    }
    gpu = host_vars(inventory, "gpu003")
    assert gpu["gpufleet_gpu_count"] == 8
    assert gpu["gpufleet_target_labels"]["gpu_model"] == "H100"
    shard = gpu["gpufleet_shard"]
    assert "gpu003" in {h.name for h in inventory.groups[f"prometheus_shard_{shard}"].get_hosts()}
    instances = host_vars(inventory, "mon01")["gpufleet_prometheus_instances"]
    assert [i["name"] for i in instances] == ["shard-0", "shard-1", "global"]


def test_parse_applies_constructed_options(plugin, tmp_path: Path) -> None:
    data = minimal_node_list(
        compose={"node_exporter_url": "'http://' ~ ansible_host ~ ':9100'"},
        groups={"big_gpu_nodes": "gpufleet_gpu_count >= 8"},
        keyed_groups=[
            {"key": "gpufleet_shard | string", "prefix": "shard"},
            {"key": "node_exporter_url", "prefix": "url"},
        ],
    )
    inventory = parse(plugin, write_node_list(tmp_path, data))
    assert host_vars(inventory, "gpu001")["node_exporter_url"] == "http://10.0.0.1:9100"
    assert {h.name for h in inventory.groups["big_gpu_nodes"].get_hosts()} == {
        "gpu001", "gpu002", "gpu003", "gpu004",
    }  # fmt: skip
    assert any(name.startswith("shard_") for name in inventory.groups)
    assert any(name.startswith("url_http") for name in inventory.groups)


def test_strict_makes_bad_compose_an_error(plugin, tmp_path: Path) -> None:
    data = minimal_node_list(strict=True, compose={"x": "undefined_variable + 1"})
    with pytest.raises(Exception, match="undefined_variable"):
        parse(plugin, write_node_list(tmp_path, data))
    data["strict"] = False
    parse(plugin, write_node_list(tmp_path, data))  # silently skipped, as in core plugins


def test_bad_input_raises_a_parser_error_naming_file_key_problem(plugin, tmp_path: Path) -> None:
    data = minimal_node_list()
    data["nodes"][0]["gpu"]["count"] = -1
    path = write_node_list(tmp_path, data)
    with pytest.raises(AnsibleParserError) as err:
        parse(plugin, path)
    assert (
        err.value.message == f"{path}: nodes[0].gpu.count: must be a non-negative integer, got -1"
    )
