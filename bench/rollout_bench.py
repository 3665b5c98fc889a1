#!/usr/bin/env python3
"""Rollout benchmark: site.yml on N fresh test bed hosts, then the idempotent rerun.

    .venv/bin/python bench/rollout_bench.py [--nodes 4] [--runs 3] [--suite trixie]

Each run creates N fresh GPU nodes (nvidia-smi test double) plus one monitoring host
on the podman test bed (Debian 12 `bookworm` or Debian 13 `trixie` hosts, each on its
distribution's packages), times `ansible-playbook site.yml` on them, times reruns
(which must report changed=0), and removes the hosts. Prints the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTBED = [sys.executable, str(REPO / "molecule" / "testbed" / "testbed.py")]
NETWORK = "gpufleet-bench"
SUBNET = "10.203.30"
CAPTURE = "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"


def node_list(nodes: int) -> str:
    return f"""plugin: gpufleet
cluster: bench
nodes:
  - hosts: "bench-gpu[001-{nodes:03d}]"
    address: "{SUBNET}.1{{num:02d}}"
    rack: r01
    gpu: {{vendor: nvidia, model: H100, count: 4}}
    cpus: 2
servers:
  - hosts: bench-mon01
    address: {SUBNET}.250
monitoring:
  prometheus_hosts: bench-mon01
  alertmanager_hosts: bench-mon01
"""


def group_vars(key: str) -> dict:
    return {
        "ansible_user": "root",
        "ansible_ssh_private_key_file": key,
        "ansible_ssh_common_args": "-o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=no",
        "node_exporter_install_method": "package",
        "prometheus_install_method": "package",
        "alertmanager_install_method": "package",
    }


def playbook(inventory: Path, *args: str) -> tuple[float, str]:
    # Fresh hosts each run: facts cached from an earlier run (another suite's Python
    # interpreter, say) must not leak in.
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_CACHE_PLUGIN="memory",
        LC_ALL="C.UTF-8",
    )
    started = time.monotonic()
    result = subprocess.run(
        ["ansible-playbook", "-i", str(inventory), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        check=False,
    )
    elapsed = time.monotonic() - started
    if result.returncode != 0:
        sys.exit(f"ansible-playbook failed:\n{result.stdout[-3000:]}\n{result.stderr[-2000:]}")
    return elapsed, result.stdout


def changed_total(output: str) -> int:
    return sum(int(n) for n in re.findall(r"changed=(\d+)", output))


def one_run(nodes: int, reruns: int, suite: str) -> tuple[float, list[float]]:
    # .1 is the network's gateway: nodes live at .101-.199.
    hosts = [f"bench-gpu{i:03d}={SUBNET}.1{i:02d}" for i in range(1, nodes + 1)]
    hosts.append(f"bench-mon01={SUBNET}.250")
    key = subprocess.run(
        [*TESTBED, "key"], capture_output=True, text=True, check=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        inventory = Path(tmp) / "inventory"
        (inventory / "group_vars" / "all").mkdir(parents=True)
        (inventory / "nodes.gpufleet.yml").write_text(node_list(nodes))
        (inventory / "group_vars" / "all" / "bench.yml").write_text(json.dumps(group_vars(key)))
        subprocess.run(
            [*TESTBED, "up", "--network", NETWORK, "--suite", suite, *hosts],
            check=True,
            capture_output=True,
        )
        try:
            fake = {
                f"bench-gpu{i:03d}": {"capture": CAPTURE, "state": "load", "gpus": 4}
                for i in range(1, nodes + 1)
            }
            playbook(
                inventory,
                str(REPO / "molecule" / "shared" / "fake_gpus.yml"),
                "-e",
                json.dumps({"fake_gpus": fake, "fake_gpu_hosts": "gpu_nodes"}),
            )
            rollout, _ = playbook(inventory, "site.yml")
            rerun_times = []
            for _ in range(reruns):
                elapsed, output = playbook(inventory, "site.yml")
                if changed_total(output):
                    sys.exit(f"rerun was not idempotent:\n{output[-3000:]}")
                rerun_times.append(elapsed)
            return rollout, rerun_times
        finally:
            subprocess.run(
                [*TESTBED, "down", "--network", NETWORK, *[h.split("=")[0] for h in hosts]],
                check=False,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3, help="fresh rollouts (hosts recreated)")
    parser.add_argument("--reruns", type=int, default=3, help="idempotent reruns per rollout")
    parser.add_argument("--suite", default="bookworm", choices=("bookworm", "trixie"))
    args = parser.parse_args()
    if not 1 <= args.nodes <= 99:
        parser.error("--nodes must be between 1 and 99 (one /24 test network)")
    subprocess.run([*TESTBED, "image", "--suite", args.suite], check=True, capture_output=True)
    rollouts, reruns = [], []
    for run in range(args.runs):
        rollout, rerun_times = one_run(args.nodes, args.reruns, args.suite)
        rollouts.append(rollout)
        reruns.extend(rerun_times)
        print(
            f"run {run + 1}: rollout {rollout:.1f}s, reruns "
            + ", ".join(f"{t:.1f}s" for t in rerun_times),
            flush=True,
        )
    print(
        f"site.yml on {args.nodes} fresh {args.suite} GPU nodes + 1 monitoring host: "
        f"median rollout {statistics.median(rollouts):.1f}s over {len(rollouts)} runs, "
        f"median idempotent rerun {statistics.median(reruns):.1f}s over {len(reruns)} reruns "
        f"(changed=0), on {os.cpu_count()} CPUs"
    )


if __name__ == "__main__":
    main()
