"""Malformed node lists and the exact one-line error each must produce.

Each case: id, a change to the minimal node list (conftest.minimal_node_list), an optional
slurm.conf text, the key path and the message. The full error is
``<file>: <key path>: <message>``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inventory_helpers import minimal_node_list, write_node_list


@dataclass(frozen=True)
class BadCase:
    id: str
    change: Callable[[dict[str, Any]], Any]
    key_path: str
    message: str
    slurm_conf: str | None = None
    error_file: str | None = None  # when the error is in another file (slurm.conf)
    extra_files: dict[str, str] = field(default_factory=dict)  # e.g. slurm.conf Includes


def edit(path: str, value: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Set ``value`` at a dotted path like ``nodes.0.gpu.count``; ``...`` deletes the key."""

    def apply(data: dict[str, Any]) -> dict[str, Any]:
        data = copy.deepcopy(data)
        *parents, last = path.split(".")
        target: Any = data
        for key in parents:
            target = target[int(key)] if isinstance(target, list) else target[key]
        if value is ...:
            del target[last]
        elif isinstance(target, list):
            target[int(last)] = value
        else:
            target[last] = value
        return data

    return apply


def add_entry(section: str, entry: dict[str, Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def apply(data: dict[str, Any]) -> dict[str, Any]:
        data = copy.deepcopy(data)
        data.setdefault(section, []).append(entry)
        return data

    return apply


def with_slurm(section: dict[str, Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return edit("slurm", section)


def both(*changes: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], Any]:
    def apply(data: dict[str, Any]) -> Any:
        for change in changes:
            data = change(data)
        return data

    return apply


GPU = {"vendor": "nvidia", "model": "H100", "count": 8}

BAD_CASES = [
    BadCase(
        "duplicate-host-across-entries",
        add_entry("nodes", {"hosts": "gpu[004-005]", "address": "10.0.2.{num}"}),
        "nodes[2].hosts",
        "duplicate host 'gpu004' (already defined by nodes[0])",
    ),
    BadCase(
        "duplicate-host-node-and-server",
        add_entry("servers", {"hosts": "cpu1", "address": "10.0.3.1"}),
        "servers[1].hosts",
        "duplicate host 'cpu1' (already defined by nodes[1])",
    ),
    BadCase(
        "duplicate-host-within-expression",
        edit("nodes.1.hosts", "cpu[1-2],cpu2"),
        "nodes[1].hosts",
        "duplicate host 'cpu2' (already defined by nodes[1])",
    ),
    BadCase(
        "duplicate-host-yaml-and-slurm-conf",
        with_slurm({"conf": "slurm.conf"}),
        "line 1",
        "duplicate host 'cpu1' (already defined by nodes[1])",
        slurm_conf="NodeName=cpu[1-3] CPUs=64\n",
        error_file="{dir}/slurm.conf",
    ),
    BadCase(
        "malformed-hostlist",
        edit("nodes.0.hosts", "gpu[001-004"),
        "nodes[0].hosts",
        "unclosed '[' in 'gpu[001-004'",
    ),
    BadCase(
        "reversed-range",
        edit("nodes.0.hosts", "gpu[004-001]"),
        "nodes[0].hosts",
        "reversed range '004-001' in 'gpu[004-001]'",
    ),
    BadCase(
        "empty-range",
        edit("nodes.0.hosts", "gpu[]"),
        "nodes[0].hosts",
        "empty range '[]' in 'gpu[]'",
    ),
    BadCase(
        "address-invalid-ip",
        edit("nodes.0.address", "10.0.0.{num}00"),
        "nodes[0].address",
        "'10.0.0.300' is not a valid IP address (for host gpu003)",
    ),
    BadCase(
        "address-duplicate-ip-across-entries",
        edit("nodes.1.address", "10.0.0.{num}"),
        "nodes[1].address",
        "address 10.0.0.1 of cpu1 duplicates that of gpu001 (nodes[0])",
    ),
    BadCase(
        "address-literal-for-many-hosts",
        edit("nodes.0.address", "10.0.0.1"),
        "nodes[0].address",
        "'10.0.0.1' would be the duplicate address of all 4 hosts; use {num} or {name}",
    ),
    BadCase(
        "address-unknown-placeholder",
        edit("nodes.0.address", "10.0.0.{number}"),
        "nodes[0].address",
        "pattern '10.0.0.{number}': unknown placeholder {number} (use {name} or {num})",
    ),
    BadCase(
        "unknown-vendor",
        edit("nodes.0.gpu.vendor", "nvida"),
        "nodes[0].gpu.vendor",
        "unknown vendor 'nvida' (choose one of: nvidia, amd)",
    ),
    BadCase(
        "unknown-collector",
        edit("nodes.0.gpu_collector", "nvml"),
        "nodes[0].gpu_collector",
        "unknown collector 'nvml' (choose one of: smi, dcgm)",
    ),
    BadCase(
        "dcgm-on-amd",
        edit("nodes.0.gpu", {"vendor": "amd", "model": "MI300X", "count": 8}),
        "nodes[0].gpu_collector",
        "dcgm needs NVIDIA GPUs, not amd",
    ),
    BadCase(
        "negative-gpu-count",
        edit("nodes.0.gpu.count", -1),
        "nodes[0].gpu.count",
        "must be a non-negative integer, got -1",
    ),
    BadCase(
        "non-integer-gpu-count",
        edit("nodes.0.gpu.count", "eight"),
        "nodes[0].gpu.count",
        "must be a non-negative integer, got 'eight'",
    ),
    BadCase(
        "invalid-label-name",
        edit("nodes.0.labels", {"data-center": "x"}),
        "nodes[0].labels.data-center",
        "invalid Prometheus label name (must match [a-zA-Z_][a-zA-Z0-9_]*)",
    ),
    BadCase(
        "label-with-double-underscore",
        edit("nodes.0.labels", {"__meta": "x"}),
        "nodes[0].labels.__meta",
        "label names starting with '__' are reserved for Prometheus",
    ),
    BadCase(
        "label-shadowing-cluster",
        edit("servers.0.labels", {"cluster": "other"}),
        "servers[0].labels.cluster",
        "label 'cluster' is set by gpufleet or Prometheus",
    ),
    BadCase(
        "shards-zero",
        edit("monitoring.shards", 0),
        "monitoring.shards",
        "must be an integer >= 1, got 0",
    ),
    BadCase(
        "replicas-zero",
        edit("monitoring.replicas", 0),
        "monitoring.replicas",
        "must be an integer >= 1, got 0",
    ),
    BadCase(
        "monitoring-hosts-empty-list",
        edit("monitoring.alertmanager_hosts", []),
        "monitoring.alertmanager_hosts",
        "names no host",
    ),
    BadCase(
        "monitoring-hosts-empty-string",
        edit("monitoring.grafana_hosts", ""),
        "monitoring.grafana_hosts",
        "empty hostlist",
    ),
    BadCase(
        "fewer-prometheus-hosts-than-replicas",
        edit("monitoring.prometheus_hosts", "mon01"),
        "monitoring.prometheus_hosts",
        "names 1 host(s), but replicas: 2 needs at least 2 "
        "(two replicas of one shard never share a host)",
    ),
    BadCase(
        "monitoring-host-not-defined",
        edit("monitoring.loki_hosts", "mon03"),
        "monitoring.loki_hosts",
        "host 'mon03' is not defined in nodes or servers",
    ),
    BadCase(
        "controller-not-defined",
        with_slurm({"controller_hosts": "slurmctl01"}),
        "slurm.controller_hosts",
        "host 'slurmctl01' is not defined in nodes or servers",
    ),
    BadCase(
        "global-hosts-missing-with-shards",
        edit("monitoring.global_hosts", ...),
        "monitoring.global_hosts",
        "required with shards: 2 (the global tier)",
    ),
    BadCase(
        "unknown-top-level-key",
        lambda d: {**d, "monitorng": {"shards": 2}},
        "monitorng",
        "unknown key; did you mean 'monitoring'?",
    ),
    BadCase(
        "unknown-entry-key",
        edit("nodes.0.gpus", GPU),
        "nodes[0].gpus",
        "unknown key; did you mean 'gpu'?",
    ),
    BadCase(
        "pin-to-missing-shard",
        edit("monitoring.pin", {"gpu001": 2}),
        "monitoring.pin.gpu001",
        "shard 2 does not exist (shards are 0..1)",
    ),
    BadCase(
        "pin-of-unknown-host",
        edit("monitoring.pin", {"gpu099": 1}),
        "monitoring.pin.gpu099",
        "host 'gpu099' is not defined in nodes or servers",
    ),
    BadCase(
        "cluster-missing",
        edit("cluster", ...),
        "cluster",
        "required",
    ),
    BadCase(
        "nodes-not-a-list",
        edit("nodes", {"hosts": "gpu1"}),
        "nodes",
        "must be a list of entries, got mapping",
    ),
    BadCase(
        "unknown-sharding-mode",
        edit("monitoring.sharding", "random"),
        "monitoring.sharding",
        "unknown mode 'random' (choose one of: balanced, rack)",
    ),
    BadCase(
        "slurm-conf-bad-gres",
        with_slurm({"conf": "slurm.conf"}),
        "line 2",
        "Gres=gpu:h100:x: cannot read 'gpu:h100:x' as gpu[:TYPE]:N",
        slurm_conf="# compute\nNodeName=sn[1-2] Gres=gpu:h100:x\n",
        error_file="{dir}/slurm.conf",
    ),
    BadCase(
        "slurm-conf-partition-with-unknown-node",
        with_slurm({"conf": "slurm.conf"}),
        "line 2",
        "partition batch names undefined node sx1",
        slurm_conf="NodeName=sn[1-2] CPUs=32\nPartitionName=batch Nodes=sx1\n",
        error_file="{dir}/slurm.conf",
    ),
    BadCase(
        "slurm-conf-missing",
        with_slurm({"conf": "missing.conf"}),
        "slurm.conf",
        "cannot read {dir}/missing.conf: No such file or directory",
    ),
    # Bounded input: address templates, numbers, host counts, slurm.conf Include.
    BadCase(
        "address-format-spec",
        edit("nodes.0.address", "{name!r:>999999999}"),
        "nodes[0].address",
        "pattern '{name!r:>999999999}': placeholder {name!r:>999999999} is not supported "
        "(use {name}, {num} or {num:0Nd} with N in 1..9)",
    ),
    BadCase(
        "address-attribute-lookup",
        edit("nodes.0.address", "{name.__class__}"),
        "nodes[0].address",
        "pattern '{name.__class__}': placeholder {name.__class__} is not supported "
        "(use {name}, {num} or {num:0Nd} with N in 1..9)",
    ),
    BadCase(
        "address-unclosed-brace",
        edit("nodes.0.address", "10.0.0.{num"),
        "nodes[0].address",
        "pattern '10.0.0.{num': unclosed '{' at position 7 "
        "(use {name}, {num} or {num:0Nd} with N in 1..9)",
    ),
    BadCase(
        "address-default-unclosed-brace",
        with_slurm({"conf": "slurm.conf", "node_defaults": {"address": "10.4.0.{num"}}),
        "slurm.node_defaults.address",
        "pattern '10.4.0.{num': unclosed '{' at position 7 "
        "(use {name}, {num} or {num:0Nd} with N in 1..9)",
        slurm_conf="NodeName=sn[1-2]\n",
    ),
    BadCase(
        "shards-over-maximum",
        edit("monitoring.shards", 100_000),
        "monitoring.shards",
        "must be at most 64, got 100000",
    ),
    BadCase(
        "shards-more-than-hosts",
        edit("monitoring.shards", 9),
        "monitoring.shards",
        "9 shards, but the node list has 8 host(s) (one at least per shard)",
    ),
    BadCase(
        "replicas-over-maximum",
        edit("monitoring.replicas", 10**12),
        "monitoring.replicas",
        "must be at most 8, got 1000000000000",
    ),
    BadCase(
        "max-imbalance-nan",
        edit("monitoring.max_imbalance", float("nan")),
        "monitoring.max_imbalance",
        "must be a number in 1.0..64.0, got nan",
    ),
    BadCase(
        "max-imbalance-inf",
        edit("monitoring.max_imbalance", float("inf")),
        "monitoring.max_imbalance",
        "must be a number in 1.0..64.0, got inf",
    ),
    BadCase(
        "max-series-per-shard-zero",
        edit("monitoring.max_series_per_shard", 0),
        "monitoring.max_series_per_shard",
        "must be an integer >= 1, got 0",
    ),
    BadCase(
        "max-series-per-shard-text",
        edit("monitoring.max_series_per_shard", "5M"),
        "monitoring.max_series_per_shard",
        "must be an integer >= 1, got '5M'",
    ),
    BadCase(
        "max-gpus-per-shard-zero",
        edit("monitoring.max_gpus_per_shard", 0),
        "monitoring.max_gpus_per_shard",
        "must be an integer >= 1, got 0",
    ),
    BadCase(
        "hosts-over-the-node-list-limit",
        both(
            add_entry("nodes", {"hosts": "a[1-60000]"}),
            add_entry("nodes", {"hosts": "b[1-60000]"}),
        ),
        "nodes[3].hosts",
        "'b[1-60000]': the node list would define more than 100,000 hosts "
        "(the limit for nodes, servers and slurm.conf together)",
    ),
    BadCase(
        "slurm-conf-include-missing",
        with_slurm({"conf": "slurm.conf"}),
        "line 2",
        "Include 'conf.d/gone.conf': cannot read {dir}/conf.d/gone.conf: No such file or directory",
        slurm_conf="NodeName=sn1\nInclude conf.d/gone.conf\n",
        error_file="{dir}/slurm.conf",
    ),
    BadCase(
        "slurm-conf-error-in-included-file",
        with_slurm({"conf": "slurm.conf"}),
        "line 2",
        "CPUs=many: must be a non-negative integer",
        slurm_conf="Include conf.d/nodes.conf\n",
        error_file="{dir}/conf.d/nodes.conf",
        extra_files={"conf.d/nodes.conf": "NodeName=sn1\nNodeName=sn2 CPUs=many\n"},
    ),
    BadCase(
        "var-overriding-contract",
        edit("nodes.0.vars", {"gpufleet_shard": 3}),
        "nodes[0].vars.gpufleet_shard",
        "set by gpufleet; use the entry's keys (address, rack, ...) instead",
    ),
]


def expected_error(case: BadCase, directory: Path, node_list: Path) -> str:
    file = (case.error_file or str(node_list)).replace("{dir}", str(directory))
    message = case.message.replace("{dir}", str(directory))
    return f"{file}: {case.key_path}: {message}"


def write_case(case: BadCase, directory: Path) -> Path:
    if case.slurm_conf is not None:
        (directory / "slurm.conf").write_text(case.slurm_conf)
    for name, text in case.extra_files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text(text)
    return write_node_list(directory, case.change(minimal_node_list()))
