"""The inventory contract (pure): host vars, groups, Prometheus instances."""

from __future__ import annotations

from typing import Any

import pytest
from inventory_helpers import minimal_node_list

from gpufleet.inventory import build_inventory, group_name, prometheus_instances
from gpufleet.nodelist import Monitoring, NodeListError, parse_node_list
from gpufleet.sizing import DEFAULT_MAX_SERIES_PER_SHARD, HostShape, estimate_series


def build(data: dict[str, Any]):
    return build_inventory(parse_node_list(data, "t.gpufleet.yml"))


def test_every_host_gets_the_contract_variables() -> None:
    plan = build(minimal_node_list())
    gpu = plan.host_vars["gpu001"]
    assert gpu == {
        "ansible_host": "10.0.0.1",
        "gpufleet_cluster": "test",
        "gpufleet_role": "node",
        "gpufleet_shard": plan.shard_of["gpu001"],
        "gpufleet_rack": "r01",
        "gpufleet_partitions": ["gpu"],
        "gpufleet_gpu_vendor": "nvidia",
        "gpufleet_gpu_model": "H100",
        "gpufleet_gpu_count": 8,
        "gpufleet_gpu_collector": "dcgm",
        "gpufleet_cpus": 224,
        "gpufleet_expected_series": estimate_series(HostShape(224, 8, "dcgm")),
        "gpufleet_target_labels": {
            "cluster": "test",
            "rack": "r01",
            "partition": "gpu",
            "gpu_model": "H100",
        },
    }
    cpu = plan.host_vars["cpu1"]
    assert (
        cpu["gpufleet_gpu_count"],
        cpu["gpufleet_gpu_model"],
        cpu["gpufleet_gpu_collector"],
    ) == (0, "", "")
    assert cpu["gpufleet_target_labels"] == {"cluster": "test", "rack": "r02"}
    assert plan.host_vars["mon01"]["gpufleet_role"] == "server"


def test_group_all_vars() -> None:
    assert build(minimal_node_list()).group_vars == {
        "all": {
            "gpufleet_cluster": "test",
            "gpufleet_shards": 2,
            "gpufleet_replicas": 2,
            "gpufleet_sharding": "balanced",
            "gpufleet_cluster_gpus": 4 * 8,
            "gpufleet_max_series_per_shard": DEFAULT_MAX_SERIES_PER_SHARD,
            "gpufleet_node_label_names": [],
        }
    }


def test_groups() -> None:
    groups = build(minimal_node_list()).groups
    assert groups["gpu_nodes"] == ["gpu001", "gpu002", "gpu003", "gpu004"]
    assert groups["cpu_nodes"] == ["cpu1", "cpu2"]
    assert groups["servers"] == ["mon01", "mon02"]
    assert groups["gpu_vendor_nvidia"] == groups["gpu_nodes"]
    assert groups["gpu_model_h100"] == groups["gpu_nodes"]
    assert groups["gpu_collector_dcgm"] == groups["gpu_nodes"]
    assert groups["rack_r01"] == groups["gpu_nodes"]
    assert groups["partition_gpu"] == groups["gpu_nodes"]
    assert groups["prometheus"] == ["mon01", "mon02"]
    assert groups["prometheus_global"] == ["mon01"]
    assert groups["alertmanager"] == ["mon01", "mon02"]
    assert groups["grafana"] == ["mon01"]
    assert groups["loki"] == ["mon02"]
    assert groups["slurm_controller"] == []


def test_shard_groups_partition_all_scraped_hosts() -> None:
    plan = build(minimal_node_list(monitoring={"shards": 5}))
    members = [h for k in range(5) for h in plan.groups[f"prometheus_shard_{k}"]]
    assert sorted(members) == sorted(plan.host_vars)  # every host exactly once
    assert all(f"prometheus_shard_{k}" in plan.groups for k in range(5))  # even empty ones
    for k in range(5):
        assert all(
            plan.host_vars[h]["gpufleet_shard"] == k for h in plan.groups[f"prometheus_shard_{k}"]
        )


def test_one_shard_has_empty_global_group() -> None:
    data = minimal_node_list()
    data["monitoring"] = {"prometheus_hosts": "mon[01-02]", "replicas": 2}
    plan = build(data)
    assert plan.groups["prometheus_global"] == []
    assert plan.groups["prometheus_shard_0"] == list(plan.host_vars)


def test_user_labels_and_vars() -> None:
    data = minimal_node_list()
    data["nodes"][1].update(
        partition=["a", "b"], labels={"site": "x"}, vars={"ansible_user": "admin"}
    )
    plan = build(data)
    assert plan.host_vars["cpu1"]["gpufleet_target_labels"] == {
        "cluster": "test",
        "rack": "r02",
        "partition": "a,b",
        "site": "x",
    }
    assert plan.host_vars["cpu1"]["ansible_user"] == "admin"
    assert plan.group_vars["all"]["gpufleet_node_label_names"] == ["site"]


def test_rack_names_that_collide_as_group_names_are_an_error() -> None:
    data = minimal_node_list()
    data["nodes"][1]["rack"] = "r-01"
    data["nodes"][0]["rack"] = "r_01"
    with pytest.raises(
        NodeListError, match=r"nodes\[1\].rack: 'r-01' and 'r_01' both map to group rack_r_01"
    ):
        build(data)


def test_group_name_sanitises() -> None:
    assert group_name("rack", "r-01.a") == "rack_r_01_a"


def instances_by_host(**monitoring: Any) -> dict[str, list[dict[str, Any]]]:
    return prometheus_instances(Monitoring(**monitoring))


def test_standalone_instances() -> None:
    assert instances_by_host(prometheus_hosts=("m1", "m2"), replicas=2) == {
        "m1": [{"name": "standalone", "mode": "standalone", "shard": None, "replica": 0}],
        "m2": [{"name": "standalone", "mode": "standalone", "shard": None, "replica": 1}],
    }


def test_sharded_instances_round_robin_and_global_tier() -> None:
    result = instances_by_host(
        shards=3, replicas=2, prometheus_hosts=("m1", "m2", "m3"), global_hosts=("m1",)
    )
    shard = lambda k, r: {"name": f"shard-{k}", "mode": "shard", "shard": k, "replica": r}  # noqa: E731
    assert result == {
        "m1": [
            shard(0, 0),
            shard(1, 1),
            {"name": "global", "mode": "global", "shard": None, "replica": 0},
        ],
        "m2": [shard(0, 1), shard(2, 0)],
        "m3": [shard(1, 0), shard(2, 1)],
    }


@pytest.mark.parametrize(
    ("shards", "replicas", "hosts"), [(4, 2, 2), (5, 3, 4), (7, 2, 3), (16, 2, 5)]
)
def test_replicas_of_a_shard_never_share_a_host(shards: int, replicas: int, hosts: int) -> None:
    names = tuple(f"m{i}" for i in range(hosts))
    result = instances_by_host(
        shards=shards, replicas=replicas, prometheus_hosts=names, global_hosts=names[:1]
    )
    placed: dict[int, list[str]] = {}
    for host, instances in result.items():
        for instance in instances:
            if instance["mode"] == "shard":
                placed.setdefault(instance["shard"], []).append(host)
    assert sorted(placed) == list(range(shards))
    assert all(len(set(h)) == replicas == len(h) for h in placed.values())
