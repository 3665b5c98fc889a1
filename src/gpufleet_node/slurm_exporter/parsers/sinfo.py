"""``sinfo -N -O ...``: one row per (node, partition)."""

from __future__ import annotations

from gpufleet_node.slurm_exporter.model import (
    MISSING,
    NodeRow,
)
from gpufleet_node.slurm_exporter.parsers.common import (
    _int,
    _pipe_records,
    parse_gres,
    parse_slurm_time,
)


def parse_sinfo_nodes(text: str) -> tuple[list[NodeRow], int]:
    """Parse ``sinfo -h -N -O NodeList:|,PartitionName:|,...,Reason:``."""
    rows: list[NodeRow] = []
    bad = 0
    for fields in _pipe_records(text.splitlines(), 10):
        if fields is None:
            bad += 1
            continue
        node, part, state, cpus, amem, mem, gres, gres_used, ts, reason = fields
        cpu_parts = cpus.split("/")
        if not node or len(cpu_parts) != 4:
            bad += 1
            continue
        try:
            c_alloc, c_idle, c_other, c_total = (int(c) for c in cpu_parts)
            g_total = parse_gres(gres)
            g_used = parse_gres(gres_used)
        except ValueError:
            bad += 1
            continue
        rows.append(
            NodeRow(
                node=node,
                partition=part.rstrip("*"),
                state=state.lower(),
                cpu_alloc=c_alloc,
                cpu_idle=c_idle,
                cpu_other=c_other,
                cpu_total=c_total,
                mem_alloc=float(_int(amem)),
                mem_total=float(_int(mem)),
                gres=g_total,
                gres_used=g_used,
                reason_timestamp=parse_slurm_time(ts),
                reason=None if reason in MISSING else reason,
            )
        )
    return rows, bad
