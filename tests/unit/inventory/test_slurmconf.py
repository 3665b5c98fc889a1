"""slurm.conf NodeName=/PartitionName= parsing."""

from __future__ import annotations

import pytest

from gpufleet.slurmconf import SlurmConfError, parse

CONF = """\
# comment line
ClusterName=hpc-a
NodeName=DEFAULT CPUs=64 RealMemory=1000
nodename=gpu[01-02] Gres=gpu:h100:8 \\
    RealMemory=2000   # continuation and lower-case key
NodeName=cpu[1-3] NodeAddr=10.0.0.[1-3]
NodeName=mixed1 Gres=gpu:a100:2,gpu:a100:2,mps:100
PartitionName=DEFAULT MaxTime=1
PartitionName=gpu Nodes=gpu[01-02]
PartitionName=all Nodes=ALL
"""


def test_node_lines_with_defaults_continuations_and_gres() -> None:
    conf = parse(CONF)
    gpu, cpu, mixed = conf.nodes
    assert (gpu.line, gpu.hosts, gpu.cpus, gpu.real_memory_mb) == (4, ("gpu01", "gpu02"), 64, 2000)
    assert (gpu.gpu_type, gpu.gpu_count) == ("h100", 8)
    assert cpu.addresses == ("10.0.0.1", "10.0.0.2", "10.0.0.3")
    assert (cpu.gpu_type, cpu.gpu_count, cpu.real_memory_mb) == (None, 0, 1000)
    assert (mixed.gpu_type, mixed.gpu_count) == ("a100", 4)
    assert conf.partitions["gpu"] == ("gpu01", "gpu02")
    assert len(conf.partitions["all"]) == 6


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("NodeName=n[1-2] CPUs=x\n", 1, "CPUs=x: must be a non-negative integer"),
        ("\nNodeName=n[2-1]\n", 2, "NodeName=n[2-1]: reversed range '2-1' in 'n[2-1]'"),
        ("NodeName=n[1-2] NodeAddr=10.0.0.1\n", 1, "NodeAddr names 1 addresses for 2 hosts"),
        (
            "NodeName=n1 Gres=gpu:a:1,gpu:b:1\n",
            1,
            "Gres=gpu:a:1,gpu:b:1: mixed GPU types are not supported",
        ),
        ("NodeName=n1 junk\n", 1, "expected Key=Value, got 'junk'"),
        ("NodeName=n1\nPartitionName=p Nodes=n2\n", 2, "partition p names undefined node n2"),
    ],
)
def test_errors_name_the_line(text: str, line: int, message: str) -> None:
    with pytest.raises(SlurmConfError) as err:
        parse(text)
    assert (err.value.line, err.value.message) == (line, message)
