"""Benchmark: the gpufleet inventory plugin vs ansible's own ``yaml`` plugin, and the plan.

    PYTHONPATH=src python bench/inventory_bench.py [--nodes 10000] [--runs 3] [--plan-only]

Writes a generated node list of N nodes, and the very same hosts, groups and host
variables as a static YAML inventory; then times ``ansible-inventory --list`` on each,
alternating, and prints the medians side by side. Also times the shard plan alone,
stateless and with a shard lock (unchanged, +64 nodes, one more shard); ``--plan-only``
times just those.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "src"))

from gpufleet.inventory import build_inventory, plan_shards  # noqa: E402
from gpufleet.nodelist import NodeList, parse_node_list  # noqa: E402
from gpufleet.shardlock import ShardLock  # noqa: E402

RACK_SIZE = 40
NODE_TYPES = (  # (gpu model, gpus, cpus, collector): a heterogeneous fleet
    ("H100", 8, 224, "dcgm"),
    ("H200", 8, 192, "dcgm"),
    ("L40S", 4, 128, "smi"),
    (None, 0, 256, "smi"),
)


def generated_node_list(nodes: int) -> dict[str, Any]:
    """Racks of 40 hosts named ``r012n07``; address ``10.<rack net>.<num>``."""
    entries = []
    for rack in range((nodes + RACK_SIZE - 1) // RACK_SIZE):
        model, gpus, cpus, collector = NODE_TYPES[rack % len(NODE_TYPES)]
        size = min(RACK_SIZE, nodes - rack * RACK_SIZE)
        entry: dict[str, Any] = {
            "hosts": f"r{rack:03d}n[01-{size:02d}]",
            "address": f"10.{rack // 200}.{rack % 200}.{{num}}",
            "rack": f"r{rack:03d}",
            "partition": ["gpu" if gpus else "cpu"],
            "cpus": cpus,
            "labels": {"site": "bench"},
            "vars": {"ansible_user": "admin"},
        }
        if gpus:
            entry["gpu"] = {"vendor": "nvidia", "model": model, "count": gpus}
            entry["gpu_collector"] = collector
        entries.append(entry)
    return {
        "plugin": "gpufleet",
        "cluster": "bench",
        "nodes": entries,
        "servers": [{"hosts": "mon[01-08]", "address": "10.250.0.{num}", "cpus": 64}],
        "monitoring": {
            "shards": 8,
            "replicas": 2,
            "prometheus_hosts": "mon[01-08]",
            "global_hosts": "mon[01-02]",
            "alertmanager_hosts": "mon[01-03]",
            "grafana_hosts": "mon01",
            "loki_hosts": "mon02",
        },
    }


def static_inventory(data: dict[str, Any]) -> dict[str, Any]:
    """The plugin's result written out as a plain YAML inventory."""
    plan = build_inventory(parse_node_list(data, "bench.gpufleet.yml"))
    children = {
        group: {"hosts": dict.fromkeys(hosts)} for group, hosts in plan.groups.items() if hosts
    }
    children.update({group: {} for group, hosts in plan.groups.items() if not hosts})
    return {"all": {"vars": plan.group_vars["all"], "hosts": plan.host_vars, "children": children}}


def ansible_env() -> dict[str, str]:
    env = dict(os.environ)
    env["ANSIBLE_CONFIG"] = str(REPO_ROOT / "ansible.cfg")
    env["PYTHONPATH"] = str(REPO_ROOT / "src")
    env["ANSIBLE_CACHE_PLUGIN"] = "memory"
    env["ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED"] = "True"
    return env


def time_ansible_inventory(source: Path) -> float:
    binary = Path(sys.executable).with_name("ansible-inventory")
    start = time.perf_counter()
    subprocess.run(
        [str(binary), "-i", str(source), "--list"],
        cwd=REPO_ROOT,
        env=ansible_env(),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


def median_time(function, runs: int) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        function()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def locked_plan_times(data: dict[str, Any], runs: int) -> dict[str, float]:
    """The shard plan with a lock of the stateless plan: unchanged, +64 nodes, +1 shard."""
    node_list = parse_node_list(data, "bench.gpufleet.yml")
    shards = node_list.monitoring.shards
    lock = ShardLock("bench.lock", node_list.cluster, shards, plan_shards(node_list))
    grown_data = generated_node_list(len(node_list.hosts) - 8 + 64)
    grown = parse_node_list(grown_data, "bench.gpufleet.yml")
    more_shards = dataclasses.replace(node_list.monitoring, shards=shards + 1)
    variants: dict[str, NodeList] = {
        "unchanged": dataclasses.replace(node_list, lock=lock),
        "+64 nodes": dataclasses.replace(grown, lock=lock),
        f"{shards} -> {shards + 1} shards": dataclasses.replace(
            node_list, lock=lock, monitoring=more_shards
        ),
    }
    return {name: median_time(lambda v=v: plan_shards(v), runs) for name, v in variants.items()}


def print_plan_times(data: dict[str, Any], node_list: NodeList, runs: int) -> None:
    hosts = len(node_list.hosts)
    plan_time = median_time(lambda: plan_shards(node_list), runs)
    print(f"shard plan alone ({hosts} hosts):        {plan_time * 1000:>7.0f} ms")
    for name, seconds in locked_plan_times(data, runs).items():
        print(f"  with a shard lock, {name + ':':<19} {seconds * 1000:>7.0f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--plan-only", action="store_true", help="time only the shard plan")
    args = parser.parse_args()
    data = generated_node_list(args.nodes)
    node_list = parse_node_list(data, "bench.gpufleet.yml")
    hosts = len(node_list.hosts)
    if args.plan_only:
        print_plan_times(data, node_list, args.runs)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        plugin_source = Path(tmp) / "plugin" / "bench.gpufleet.yml"
        static_source = Path(tmp) / "static" / "hosts.yml"
        plugin_source.parent.mkdir()
        static_source.parent.mkdir()
        plugin_source.write_text(yaml.safe_dump(data, sort_keys=False))
        static_source.write_text(yaml.safe_dump(static_inventory(data), sort_keys=False))
        plugin_times, static_times = [], []
        for _ in range(args.runs):  # alternate so both see the same machine state
            plugin_times.append(time_ansible_inventory(plugin_source))
            static_times.append(time_ansible_inventory(static_source))
        full_time = median_time(
            lambda: build_inventory(parse_node_list(data, "bench.gpufleet.yml")), args.runs
        )
        static_size = static_source.stat().st_size
        plugin_size = plugin_source.stat().st_size
    plugin_median, static_median = statistics.median(plugin_times), statistics.median(static_times)
    print(f"hosts: {hosts} ({args.nodes} nodes + servers), shards: 8, median of {args.runs} runs")
    print(f"{'ansible-inventory --list':<40} {'median s':>9}  runs")
    print(
        f"{'  gpufleet plugin (' + str(plugin_size // 1024) + ' KiB node list)':<40} "
        f"{plugin_median:>9.2f}  {' '.join(f'{t:.2f}' for t in plugin_times)}"
    )
    print(
        f"{'  yaml plugin (' + str(static_size // 1024) + ' KiB static inventory)':<40} "
        f"{static_median:>9.2f}  {' '.join(f'{t:.2f}' for t in static_times)}"
    )
    print(f"  ratio gpufleet / yaml: {plugin_median / static_median:.2f}")
    print_plan_times(data, node_list, args.runs)
    print(f"validate + plan + vars/groups (pure):   {full_time * 1000:>7.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
