"""Shared helpers for the gpufleet inventory tests (a uniquely named module, not conftest,
so that other test directories can have their own conftest.py)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[3]
SRC = REPO_ROOT / "src"
ANSIBLE_INVENTORY = Path(sys.executable).with_name("ansible-inventory")


def ansible_env() -> dict[str, str]:
    """Run Ansible with the repo's config and the package from this checkout.

    Failing the run on an unparsable source is what ansible.cfg's
    ``[inventory] any_unparsed_is_failed`` does; it is set here too so the tests do not
    depend on that line.
    """
    env = dict(os.environ)
    env["ANSIBLE_CONFIG"] = str(REPO_ROOT / "ansible.cfg")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    env["ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED"] = "True"
    env["ANSIBLE_INVENTORY_UNPARSED_FAILED"] = "True"
    env["ANSIBLE_NOCOLOR"] = "1"
    env.setdefault("LC_ALL", "C.UTF-8")  # ansible refuses to run without a UTF-8 locale
    env["ANSIBLE_CACHE_PLUGIN"] = "memory"  # facts cached by test beds must not leak in
    env["ANSIBLE_LOCAL_TEMP"] = str(Path(os.environ.get("TMPDIR", "/tmp")) / "gpufleet-ansible-tmp")
    return env


def run_ansible_inventory(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ANSIBLE_INVENTORY), *args],
        cwd=REPO_ROOT,
        env=ansible_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def assert_one_error(stderr: str, source: str, message: str) -> None:
    """stderr holds gpufleet's message once and Ansible's fixed closing line for a failed
    source, nothing else. ansible-core 2.19 prints ``[WARNING]: Failed to parse inventory
    with 'gpufleet' plugin: MESSAGE`` and ``[ERROR]: Completely failed ...``; 2.18 prints
    ``[WARNING]:  * Failed to parse SOURCE with gpufleet plugin: MESSAGE``, wrapped at 80
    columns (so compared without whitespace), and ``ERROR! Completely failed ...``."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    closings = {
        f"[ERROR]: Completely failed to parse inventory source {source}",
        f"ERROR! Completely failed to parse inventory source {source}",
    }
    assert closings & set(lines), stderr
    rest = [line for line in lines if line not in closings]
    if rest and rest[0].startswith("[WARNING]:  * Failed to parse"):
        squeeze = "".join
        want = f"[WARNING]: * Failed to parse {source} with gpufleet plugin: {message}"
        assert squeeze("".join(rest).split()) == squeeze(want.split()), stderr
    else:
        assert rest == [
            f"[WARNING]: Failed to parse inventory with 'gpufleet' plugin: {message}"
        ], stderr


def minimal_node_list(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "plugin": "gpufleet",
        "cluster": "test",
        "nodes": [
            {
                "hosts": "gpu[001-004]",
                "address": "10.0.0.{num}",
                "rack": "r01",
                "partition": ["gpu"],
                "gpu": {"vendor": "nvidia", "model": "H100", "count": 8},
                "gpu_collector": "dcgm",
                "cpus": 224,
            },
            {"hosts": "cpu[1-2]", "address": "10.0.1.{num}", "rack": "r02", "cpus": 64},
        ],
        "servers": [{"hosts": "mon[01-02]", "address": "10.0.9.{num}"}],
        "monitoring": {
            "shards": 2,
            "replicas": 2,
            "prometheus_hosts": "mon[01-02]",
            "global_hosts": "mon01",
            "alertmanager_hosts": "mon[01-02]",
            "grafana_hosts": "mon01",
            "loki_hosts": "mon02",
        },
    }
    data.update(overrides)
    return data


def write_node_list(directory: Path, data: Any, name: str = "nodes.gpufleet.yml") -> Path:
    path = directory / name
    text = data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False)
    path.write_text(text)
    return path


def synthetic_cluster(seed: int, min_hosts: int = 1000) -> dict[str, int]:
    """Host -> weight for a heterogeneous cluster shaped like real ones.

    Racks of 8..64 hosts; 0, 4 or 8 GPUs; 32..256 threads; series from the same formula
    the node list uses, so weights vary about 6x between the lightest and heaviest host.
    """
    from gpufleet.sizing import HostShape, estimate_series, exporters

    # The exporters whose series the planner's stability bounds (test_sharding.py) were
    # measured with. An exporter added to the registry since (the IPMI exporter's
    # estimated, constant 300 series per compute node) makes the weights more alike and
    # moves the measured collateral: re-measure those bounds before adding it here.
    measured = {job: exporters()[job] for job in ("node", "dcgm")}

    rnd = random.Random(seed)
    weights: dict[str, int] = {}
    rack = 0
    while len(weights) < min_hosts:
        rack += 1
        size = rnd.choice([8, 16, 16, 32, 32, 48, 64])
        gpus = rnd.choice([0, 4, 8, 8, 8])
        cpus = rnd.choice([32, 64, 96, 128, 192, 256])
        collector = rnd.choice(["smi", "dcgm"])
        weight = estimate_series(HostShape(cpus, gpus, collector), measured)
        prefix = rnd.choice(["gpu", "node", "nid", "a100-", "cpu"])
        for index in range(1, size + 1):
            weights[f"r{rack:03d}-{prefix}{index:03d}"] = weight
    return weights


def racks_of(weights: dict[str, int]) -> dict[str, str]:
    return {host: host.split("-", 1)[0] for host in weights}
