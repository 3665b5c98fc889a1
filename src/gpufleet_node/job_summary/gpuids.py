"""Which NVML index a Slurm GPU index means on each node, through the device minors.

Slurm's GRES index follows ``/dev/nvidiaN`` (the device minor), which need not be
nvidia-smi's index (jobstats issue #34). Both ``gpufleet jobstats`` and the epilog's
summary translate with these two functions, so they agree on every job.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpufleet_node.job_summary.summary import SAFE_GPU, SAFE_NODE

MinorMap = dict[tuple[str, str], str]


def minor_map(labels: Iterable[dict[str, str]]) -> MinorMap:
    """(node, device minor) -> NVML index, from ``gpu:device_minor:info`` label sets.

    A minor claimed by two GPUs of a node is left out: it names no GPU for sure (the
    rules drop it from the join likewise).
    """
    found: dict[tuple[str, str], set[str]] = {}
    for label in labels:
        node, gpu, minor = label.get("node", ""), label.get("gpu", ""), label.get("minor", "")
        if SAFE_NODE.fullmatch(node) and SAFE_GPU.fullmatch(gpu) and SAFE_GPU.fullmatch(minor):
            found.setdefault((node, minor), set()).add(gpu)
    return {key: gpus.pop() for key, gpus in found.items() if len(gpus) == 1}


def nvml_indices(
    slurm_indices: dict[str, list[str]],
    minors: MinorMap,
    reporting: set[str] | None = None,
) -> dict[str, list[str]]:
    """Each node's Slurm GPU indices as NVML indices, sorted.

    A node that reported minors (``reporting``, before ambiguous ones were dropped) maps
    each index through them and drops an index no GPU has for sure; a node that reported
    none keeps Slurm's index (index = minor, the rules' fallback).
    """
    mapped_nodes = {node for node, _ in minors} | (reporting or set())
    out: dict[str, list[str]] = {}
    for node, indices in slurm_indices.items():
        if node in mapped_nodes:
            gpus = [minors[(node, i)] for i in indices if (node, i) in minors]
        else:
            gpus = list(indices)
        out[node] = sorted(set(gpus), key=int)
    return out
