#!/usr/bin/env python3
"""Federation benchmark: series held by the global tier vs raw series in the shards,
and scrape duration per shard, on a running gpufleet cluster.

    .venv/bin/python bench/federation_bench.py INVENTORY_DIR

INVENTORY_DIR is the cluster's gpufleet node list directory (for the test bed:
molecule/cluster/inventory after `molecule converge -s cluster`). Instance URLs come
from the inventory plugin, as the roles derive them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

from gpufleet.inventory_json import plain

REPO = Path(__file__).resolve().parents[1]


def instances(inventory_dir: str) -> list[tuple[str, str]]:
    """(instance description, base URL) for every Prometheus instance of the inventory."""
    result = subprocess.run(
        ["ansible-inventory", "-i", inventory_dir, "--list"],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg")),
    )
    data = plain(json.loads(result.stdout))
    found = []
    for host in sorted(data.get("prometheus", {}).get("hosts", [])):
        hostvars = data["_meta"]["hostvars"][host]
        for instance in hostvars.get("gpufleet_prometheus_instances", []):
            port = 9091 + instance["shard"] if instance["mode"] == "shard" else 9090
            label = f"{instance['name']} (replica {instance['replica']}) on {host}"
            found.append((label, f"http://{hostvars['ansible_host']}:{port}"))
    return found


def scalar(base: str, promql: str) -> float:
    url = f"{base}/api/v1/query?query={urllib.parse.quote(promql)}"
    with urllib.request.urlopen(url, timeout=30) as response:
        result = json.load(response)["data"]["result"]
    return float(result[0]["value"][1]) if result else 0.0


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    shards, raw_total, global_series = [], 0.0, None
    for label, base in instances(sys.argv[1]):
        series = scalar(base, 'prometheus_tsdb_head_series{job="prometheus"}')
        if label.startswith("global") or label.startswith("standalone"):
            federated = scalar(base, 'count({job="federate"})')
            global_series = (label, series, federated)
            continue
        raw_total += series
        scrape = scalar(base, 'max(scrape_duration_seconds{job="node"})')
        avg = scalar(base, 'avg(scrape_duration_seconds{job="node"})')
        targets = scalar(base, 'count(up{job="node"})')
        shards.append(label)
        print(
            f"{label}: {series:.0f} head series, {targets:.0f} node targets, "
            f"node scrape duration avg {avg * 1000:.1f} ms / max {scrape * 1000:.1f} ms"
        )
    if global_series:
        label, series, federated = global_series
        share = federated / raw_total * 100 if raw_total else 0.0
        print(
            f"{label}: {series:.0f} head series, of which {federated:.0f} federated "
            f"from the shards = {share:.1f} % of the shards' {raw_total:.0f} series"
        )


if __name__ == "__main__":
    main()
