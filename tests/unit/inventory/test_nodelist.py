"""Node list validation: good input becomes frozen dataclasses, bad input one clear error."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from inventory_bad_inputs import BAD_CASES, BadCase, expected_error, write_case
from inventory_helpers import minimal_node_list, write_node_list

from gpufleet.nodelist import (
    NodeListError,
    address_problem,
    load_node_list,
    parse_node_list,
    render_address,
)
from gpufleet.sizing import HostShape, estimate_series


@pytest.mark.parametrize("case", BAD_CASES, ids=lambda c: c.id)
def test_bad_input_gives_one_line_naming_file_key_and_problem(
    case: BadCase, tmp_path: Path
) -> None:
    path = write_case(case, tmp_path)
    with pytest.raises(NodeListError) as err:
        load_node_list(str(path))
    assert str(err.value) == expected_error(case, tmp_path, path)
    assert "\n" not in str(err.value)


def test_there_are_at_least_20_bad_input_cases() -> None:
    assert len(BAD_CASES) >= 20
    assert len({case.id for case in BAD_CASES}) == len(BAD_CASES)


def test_error_message_format_matches_the_contract() -> None:
    err = NodeListError(
        "nodes.gpufleet.yml", "nodes[2].gpu.count", "must be a non-negative integer, got -1"
    )
    assert (
        str(err) == "nodes.gpufleet.yml: nodes[2].gpu.count: must be a non-negative integer, got -1"
    )


def test_invalid_yaml_names_the_line(tmp_path: Path) -> None:
    path = write_node_list(tmp_path, "plugin: gpufleet\nnodes: [\n")
    with pytest.raises(NodeListError, match=r"nodes.gpufleet.yml: line \d+: invalid YAML"):
        load_node_list(str(path))


def test_minimal_node_list_loads_into_frozen_hosts(node_list_path: Path) -> None:
    node_list = load_node_list(str(node_list_path))
    assert node_list.cluster == "test"
    assert [h.name for h in node_list.hosts] == [
        "gpu001", "gpu002", "gpu003", "gpu004", "cpu1", "cpu2", "mon01", "mon02",
    ]  # fmt: skip
    gpu = node_list.hosts[0]
    assert (gpu.address, gpu.rack, gpu.partitions) == ("10.0.0.1", "r01", ("gpu",))
    assert (gpu.gpu_vendor, gpu.gpu_model, gpu.gpu_count, gpu.gpu_collector) == (
        "nvidia", "H100", 8, "dcgm",
    )  # fmt: skip
    assert gpu.expected_series == estimate_series(HostShape(224, 8, "dcgm"))
    cpu = node_list.hosts[4]
    assert (cpu.gpu_count, cpu.gpu_vendor, cpu.gpu_collector, cpu.role) == (0, "", "", "node")
    assert node_list.hosts[-1].role == "server"
    with pytest.raises(dataclasses.FrozenInstanceError):
        gpu.name = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("pattern", "name", "expected"),
    [
        ("10.1.0.{num}", "gpu007", "10.1.0.7"),
        ("10.1.{num:d}.1", "r2", "10.1.2.1"),
        ("{name}.cluster.example", "gpu007", "gpu007.cluster.example"),
        ("bmc-{num:03d}", "n7", "bmc-007"),
        ("fd00::{num}", "gpu12", "fd00::12"),
        # the forms docs/inventory.md "Addresses" allows
        ("bmc-{num:03d}", "gpu7", "bmc-007"),
        ("bmc-{num:09}", "gpu7", "bmc-000000007"),
        ("bmc-{num:d}", "gpu007", "bmc-7"),
        ("{name}.mgmt.example.org", "gpu007", "gpu007.mgmt.example.org"),
        ("gpu007.example.org", "gpu007", "gpu007.example.org"),
    ],
)
def test_render_address(pattern: str, name: str, expected: str) -> None:
    assert render_address(pattern, name) == expected
    assert address_problem(expected) is None


def test_num_placeholder_needs_a_number() -> None:
    with pytest.raises(ValueError, match="has no number"):
        render_address("10.0.0.{num}", "login")


@pytest.mark.parametrize("address", ["10.0.0.256", "1.2.3", "-bad.example", "a b"])
def test_address_problem_flags_invalid_addresses(address: str) -> None:
    assert address_problem(address)


def test_expected_series_override_and_default_cpus() -> None:
    data = minimal_node_list()
    data["nodes"][1]["expected_series"] = 4242
    data["servers"][0].pop("address")
    node_list = parse_node_list(data, "x.gpufleet.yml")
    by_name = {h.name: h for h in node_list.hosts}
    assert by_name["cpu1"].expected_series == 4242
    assert by_name["mon01"].cpus == 64
    assert by_name["mon01"].address == "mon01"  # no address: connect by name


def test_gpu_count_zero_is_a_cpu_node() -> None:
    data = minimal_node_list()
    data["nodes"][0]["gpu"] = {"count": 0}
    host = parse_node_list(data, "x.gpufleet.yml").hosts[0]
    assert (host.gpu_count, host.gpu_vendor, host.gpu_collector) == (0, "", "")


def test_monitoring_host_lists_accept_yaml_lists() -> None:
    data = minimal_node_list()
    data["monitoring"]["alertmanager_hosts"] = ["mon01", "mon02"]
    assert parse_node_list(data, "x").monitoring.alertmanager_hosts == ("mon01", "mon02")


def test_slurm_conf_nodes_join_the_node_list(tmp_path: Path) -> None:
    (tmp_path / "slurm.conf").write_text(
        "NodeName=DEFAULT RealMemory=1000\n"
        "NodeName=sg[01-04] CPUs=96 Gres=gpu:a100:4 NodeAddr=10.0.5.[1-4]\n"
        "NodeName=mi[1-2] CPUs=128 Gres=gpu:mi250:8\n"
        "PartitionName=a100 Nodes=sg[01-04]\nPartitionName=all Nodes=ALL\n"
    )
    data = minimal_node_list(
        slurm={
            "conf": "slurm.conf",
            "node_defaults": {"rack": "r05", "address": "10.0.6.{num}", "labels": {"hall": "h2"}},
        }
    )
    node_list = load_node_list(str(write_node_list(tmp_path, data)))
    by_name = {h.name: h for h in node_list.hosts}
    sg = by_name["sg03"]
    assert (sg.address, sg.cpus, sg.gpu_vendor, sg.gpu_model, sg.gpu_count) == (
        "10.0.5.3", 96, "nvidia", "a100", 4,
    )  # fmt: skip
    assert sg.partitions == ("a100", "all")
    assert sg.rack == "r05" and sg.labels == {"hall": "h2"}
    mi = by_name["mi2"]
    assert (mi.address, mi.gpu_vendor, mi.partitions) == ("10.0.6.2", "amd", ("all",))
