"""Node list -> hosts with variables and groups. Pure: no Ansible imports, no I/O.

This is the contract the roles consume; docs/inventory.md documents every name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpufleet import sharding
from gpufleet.nodelist import Host, Monitoring, NodeList, NodeListError
from gpufleet.sizing import KIND_GROUPS, kind_groups

MONITORING_GROUPS = {
    "prometheus": "prometheus_hosts",
    "prometheus_global": "global_hosts",
    "alertmanager": "alertmanager_hosts",
    "grafana": "grafana_hosts",
    "loki": "loki_hosts",
}
_UNSAFE_GROUP_CHARS = re.compile(r"[^A-Za-z0-9_]")


@dataclass(frozen=True)
class InventoryPlan:
    """Everything the plugin adds: host vars, group members, group vars."""

    host_vars: dict[str, dict[str, Any]]
    groups: dict[str, list[str]]
    group_vars: dict[str, dict[str, Any]]
    shard_of: dict[str, int]


def group_name(prefix: str, value: str) -> str:
    """``rack``, ``r-01`` -> ``rack_r_01``: a valid Ansible group name."""
    return f"{prefix}_{_UNSAFE_GROUP_CHARS.sub('_', value)}"


def target_labels(cluster: str, host: Host) -> dict[str, str]:
    """Labels every scrape target of ``host`` carries."""
    labels = {"cluster": cluster}
    if host.rack:
        labels["rack"] = host.rack
    if host.partitions:
        labels["partition"] = ",".join(host.partitions)
    if host.gpu_count:
        labels["gpu_model"] = host.gpu_model
    labels.update(host.labels)
    return labels


def node_label_names(hosts: Iterable[Host]) -> list[str]:
    """The custom label names (the node list's ``labels:``) of any of hosts, sorted."""
    return sorted({name for host in hosts for name in host.labels})


def plan_shards(node_list: NodeList) -> dict[str, int]:
    """Host -> shard for every host (servers included: node_exporter runs everywhere).

    Sticky when the node list carries a shard lock (``node_list.lock``), else stateless.
    """
    monitoring = node_list.monitoring
    weights = {host.name: host.expected_series for host in node_list.hosts}
    racks = None
    if monitoring.sharding == "rack":
        racks = {host.name: host.rack for host in node_list.hosts}
    lock = node_list.lock
    try:
        return sharding.plan_hosts(
            weights,
            monitoring.shards,
            monitoring.pin,
            racks,
            monitoring.max_imbalance,
            previous=lock.hosts if lock else None,
            previous_shards=lock.shards if lock else None,
            rebalance_margin=monitoring.rebalance_margin,
        )
    except sharding.ShardingError as err:
        raise NodeListError(node_list.file, "monitoring.pin", str(err)) from err


PROMETHEUS_PORT_BASE = 9090  # the prometheus role's prometheus_port_base default


def prometheus_port(instance: Mapping[str, Any], port_base: int = PROMETHEUS_PORT_BASE) -> int:
    """The port of one instance of :func:`prometheus_instances`.

    The standalone and global instances listen on the base port, shard k on base + 1 + k:
    the prometheus role (filter gpufleet_prometheus_port) and ``gpufleet jobstats`` both
    ask here.
    """
    if instance.get("mode") == "shard":
        return int(port_base) + 1 + int(instance["shard"])
    return int(port_base)


def prometheus_ports(
    instances: Iterable[Mapping[str, Any]], port_base: int = PROMETHEUS_PORT_BASE
) -> list[int]:
    """The port of each of instances, in their order (:func:`prometheus_port`): what the
    exporter firewall opens on a prometheus host."""
    return [prometheus_port(instance, port_base) for instance in instances]


def prometheus_instances(monitoring: Monitoring) -> dict[str, list[dict[str, Any]]]:
    """Which Prometheus instances each prometheus host runs.

    Replica r of shard k runs on ``prometheus_hosts[(k * replicas + r) % len]``; the
    validation guarantees len >= replicas, so two replicas of a shard never share a host.
    """
    hosts = monitoring.prometheus_hosts
    instances: dict[str, list[dict[str, Any]]] = {host: [] for host in hosts}
    if not hosts:
        return instances
    replicas = monitoring.replicas
    if monitoring.shards == 1:
        for replica in range(replicas):
            instances[hosts[replica % len(hosts)]].append(
                {"name": "standalone", "mode": "standalone", "shard": None, "replica": replica}
            )
        return instances
    for shard in range(monitoring.shards):
        for replica in range(replicas):
            host = hosts[(shard * replicas + replica) % len(hosts)]
            instances[host].append(
                {"name": f"shard-{shard}", "mode": "shard", "shard": shard, "replica": replica}
            )
    for replica, host in enumerate(monitoring.global_hosts):
        instances.setdefault(host, []).append(
            {"name": "global", "mode": "global", "shard": None, "replica": replica}
        )
    return instances


def host_variables(cluster: str, host: Host, shard: int) -> dict[str, Any]:
    return {
        "ansible_host": host.address,
        "gpufleet_cluster": cluster,
        "gpufleet_role": host.role,
        "gpufleet_shard": shard,
        "gpufleet_rack": host.rack,
        "gpufleet_partitions": list(host.partitions),
        "gpufleet_gpu_vendor": host.gpu_vendor,
        "gpufleet_gpu_model": host.gpu_model,
        "gpufleet_gpu_count": host.gpu_count,
        "gpufleet_gpu_collector": host.gpu_collector,
        "gpufleet_cpus": host.cpus,
        "gpufleet_expected_series": host.expected_series,
        "gpufleet_target_labels": target_labels(cluster, host),
        **host.vars,
    }


class GroupBuilder:
    """Collects group members; refuses two different values that sanitise to one name."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.groups: dict[str, list[str]] = {}
        self.origin: dict[str, str] = {}

    def add(self, group: str, host: str) -> None:
        self.groups.setdefault(group, []).append(host)

    def add_value(self, prefix: str, value: str, host: Host, key: str) -> None:
        name = group_name(prefix, value)
        if self.origin.setdefault(name, value) != value:
            raise NodeListError(
                self.file,
                f"{host.source}.{key}",
                f"{value!r} and {self.origin[name]!r} both map to group {name}",
            )
        self.add(name, host.name)

    def ensure(self, group: str) -> None:
        self.groups.setdefault(group, [])


def host_groups(builder: GroupBuilder, host: Host) -> None:
    for group in kind_groups(host.role, host.gpu_count):
        builder.add(group, host.name)
    if host.gpu_count:
        builder.add_value("gpu_vendor", host.gpu_vendor, host, "gpu.vendor")
        builder.add_value("gpu_model", host.gpu_model.lower(), host, "gpu.model")
        builder.add_value("gpu_collector", host.gpu_collector, host, "gpu_collector")
    if host.rack:
        builder.add_value("rack", host.rack, host, "rack")
    for partition in host.partitions:
        builder.add_value("partition", partition, host, "partition")


def build_inventory(node_list: NodeList) -> InventoryPlan:
    """The full inventory for a validated node list."""
    monitoring = node_list.monitoring
    shard_of = plan_shards(node_list)
    builder = GroupBuilder(node_list.file)
    for group in (*KIND_GROUPS, *MONITORING_GROUPS, "slurm_controller"):
        builder.ensure(group)
    for shard in range(monitoring.shards):
        builder.ensure(f"prometheus_shard_{shard}")
    host_vars: dict[str, dict[str, Any]] = {}
    for host in node_list.hosts:
        shard = shard_of[host.name]
        host_vars[host.name] = host_variables(node_list.cluster, host, shard)
        host_groups(builder, host)
        builder.add(f"prometheus_shard_{shard}", host.name)
    for group, key in MONITORING_GROUPS.items():
        for name in dict.fromkeys(getattr(monitoring, key)):
            builder.add(group, name)
    for name in dict.fromkeys(node_list.slurm_controller_hosts):
        builder.add("slurm_controller", name)
    for name, instances in prometheus_instances(monitoring).items():
        host_vars[name]["gpufleet_prometheus_instances"] = instances
    group_vars = {
        "all": {
            "gpufleet_cluster": node_list.cluster,
            "gpufleet_shards": monitoring.shards,
            "gpufleet_replicas": monitoring.replicas,
            "gpufleet_sharding": monitoring.sharding,
            # What every running GPU job can hold at once: the Slurm exporter's per-job
            # series caps follow it (a (job, node) pair or a GPU index holds >= 1 GPU).
            "gpufleet_cluster_gpus": sum(host.gpu_count for host in node_list.hosts),
            # The head series one Prometheus may hold (PrometheusSeriesNearBudget at 80 %).
            "gpufleet_max_series_per_shard": monitoring.max_series_per_shard,
            # The custom label names of all hosts (their `labels:`), sorted: the prometheus
            # role keeps them on every node-level rule and alert (src/gpufleet/rule_labels.py).
            "gpufleet_node_label_names": node_label_names(node_list.hosts),
        }
    }
    if monitoring.shard_lock:
        # The lock file the plugin reads (monitoring.shard_lock resolved): remove_node.yml
        # takes a leaving node out of it.
        group_vars["all"]["gpufleet_shard_lock"] = monitoring.shard_lock
    return InventoryPlan(
        host_vars=host_vars, groups=builder.groups, group_vars=group_vars, shard_of=shard_of
    )


def shard_table(node_list: NodeList, shard_of: Mapping[str, int]) -> list[dict[str, Any]]:
    """Per shard: hosts, GPUs, expected series (for ``gpufleet plan``)."""
    rows = [
        {"shard": shard, "hosts": 0, "gpus": 0, "series": 0}
        for shard in range(node_list.monitoring.shards)
    ]
    for host in node_list.hosts:
        row = rows[shard_of[host.name]]
        row["hosts"] += 1
        row["gpus"] += host.gpu_count
        row["series"] += host.expected_series
    return rows
