"""Parse functions, one module per Slurm command output. Pure: text in, data out.

Malformed lines are skipped and counted (returned as ``bad``), never raised.
"""

from __future__ import annotations

from collections.abc import Callable

from gpufleet_node.slurm_exporter.parsers.common import parse_version
from gpufleet_node.slurm_exporter.parsers.jobs import parse_scontrol_jobs, parse_scontrol_jobs_json
from gpufleet_node.slurm_exporter.parsers.sdiag import parse_sdiag
from gpufleet_node.slurm_exporter.parsers.sinfo import parse_sinfo_nodes
from gpufleet_node.slurm_exporter.parsers.squeue import parse_squeue
from gpufleet_node.slurm_exporter.parsers.sshare import parse_sshare

# The parser of each command name of model.COMMANDS (and of the JSON job source).
PARSERS: dict[str, Callable[[str], tuple[object, int]]] = {
    "sinfo_version": lambda t: (parse_version(t), 0),
    "sinfo_nodes": parse_sinfo_nodes,
    "squeue": parse_squeue,
    "scontrol_jobs": parse_scontrol_jobs,
    "scontrol_jobs_json": parse_scontrol_jobs_json,
    "sdiag": parse_sdiag,
    "sshare": parse_sshare,
}
