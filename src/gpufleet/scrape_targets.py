"""Prometheus' file_sd targets, from the inventory.

Pure: no Ansible imports, no I/O. The roles call these through the filters of
plugins/filter/gpufleet_filters.py, with the inventory's hostvars; every target group is
``{"targets": ["address:port"], "labels": {...}}``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypedDict

from gpufleet.inventory import prometheus_port


class TargetGroup(TypedDict):
    """One file_sd entry: its targets and their labels."""

    targets: list[str]
    labels: dict[str, str]


def host_port(address: str, port: int) -> str:
    """address:port, an IPv6 address in brackets."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def _port(value: object, default: int, host: str) -> int:
    """A TCP port from the inventory (a number or its text), else default."""
    value = default if value is None or value == "" else value
    text = str(value).strip()
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"host {host}: port {value!r} is not a TCP port (1-65535)")
    return int(text)


def targets(
    hostnames: Iterable[str],
    hostvars: Mapping[str, Any],
    port: int,
    port_variable: str | None = None,
) -> list[TargetGroup]:
    """file_sd target groups for one exporter on hosts, labelled from the inventory.

    The port is each host's own port_variable (node_exporter_port, from its host_vars or
    group_vars), else ``port``: an override moves the scrape with the exporter. The
    labels are the inventory plugin's gpufleet_target_labels plus node (the
    inventory name, which Slurm and the dashboards use); roles never derive them.
    """
    groups: list[TargetGroup] = []
    for name in sorted(hostnames):
        host = hostvars[name]
        labels = {str(k): str(v) for k, v in dict(host.get("gpufleet_target_labels") or {}).items()}
        labels["node"] = name
        address = str(host.get("ansible_host") or name)
        own = host.get(port_variable) if port_variable else None
        groups.append({"targets": [host_port(address, _port(own, port, name))], "labels": labels})
    return groups


def metrics_paths(groups: list[TargetGroup], paths: list[str] | None) -> list[TargetGroup]:
    """One target group per group and path, its __metrics_path__ set: one job scrapes
    several endpoints of the same daemon (slurmctld's /metrics/nodes, /metrics/jobs...)."""
    if not paths:
        return groups
    for path in paths:
        if not isinstance(path, str) or not path.startswith("/") or any(c in path for c in "?# "):
            raise ValueError(f"metrics path {path!r} is not an absolute URL path")
    return [
        # metrics_path keeps the endpoints' up (and scrape_*) series apart: one failing
        # endpoint must not make a single `up` series flap.
        {
            "targets": group["targets"],
            "labels": {**group["labels"], "__metrics_path__": path, "metrics_path": path},
        }
        for group in groups
        for path in paths
    ]


def shard_targets(
    prometheus_hosts: Iterable[str], hostvars: Mapping[str, Any], port_base: int
) -> list[TargetGroup]:
    """file_sd target groups for every shard instance (all replicas) in the inventory."""
    groups: list[TargetGroup] = []
    for name in sorted(prometheus_hosts):
        host = hostvars[name]
        address = str(host.get("ansible_host") or name)
        for instance in host.get("gpufleet_prometheus_instances") or []:
            if instance.get("mode") != "shard":
                continue
            groups.append(
                {
                    "targets": [host_port(address, prometheus_port(instance, port_base))],
                    "labels": {
                        "shard": str(instance["shard"]),
                        "replica": str(instance["replica"]),
                        "node": name,
                    },
                }
            )
    return sorted(groups, key=lambda g: (int(g["labels"]["shard"]), g["labels"]["replica"]))
