"""``sdiag``: scheduler statistics."""

from __future__ import annotations

import re

from gpufleet_node.slurm_exporter.model import (
    Sdiag,
)
from gpufleet_node.slurm_exporter.parsers.common import _float

_SDIAG_TOP = {
    "Server thread count": "threads",
    "Agent queue size": "queue_size",
    "Agent count": "agent_count",
    "Agent thread count": "agent_thread_count",
    "DBD Agent queue size": "dbd_queue_size",
    "Jobs submitted": "jobs_submitted",
    "Jobs started": "jobs_started",
    "Jobs completed": "jobs_completed",
    "Jobs canceled": "jobs_canceled",
    "Jobs failed": "jobs_failed",
    "Jobs pending": "jobs_pending",
    "Jobs running": "jobs_running",
}
_SDIAG_MAIN = {
    "Last cycle": "last_cycle",
    "Max cycle": "max_cycle",
    "Total cycles": "total_cycles",
    "Mean cycle": "mean_cycle",
    "Mean depth cycle": "mean_depth_cycle",
    "Cycles per minute": "cycle_per_minute",
    "Last queue length": "last_queue_length",
}
_SDIAG_BACKFILL = {
    "Total backfilled jobs (since last slurm start)": "backfilled_jobs_since_start",
    "Total backfilled jobs (since last stats cycle start)": "backfilled_jobs_since_cycle",
    "Total backfilled heterogeneous job components": "backfilled_heterogeneous",
    "Total cycles": "backfill_total_cycles",
    "Last cycle": "backfill_last_cycle",
    "Max cycle": "backfill_max_cycle",
    "Mean cycle": "backfill_mean_cycle",
    "Last depth cycle": "backfill_last_depth_cycle",
    "Depth Mean": "backfill_depth_mean",
    "Last queue length": "backfill_last_queue_length",
    "Queue length mean": "backfill_queue_length_mean",
}
# sdiag's section headings (lower case, as a line starts) and the section each opens.
_SDIAG_SECTIONS = (
    ("main schedule statistics", "main"),
    ("backfilling stats", "backfill"),
    ("remote procedure call statistics by message type", "rpc_type"),
    ("remote procedure call statistics by user", "rpc_user"),
    ("pending rpc statistics", "other"),
    ("latency for", "other"),
)
_RPC_RE = re.compile(r"^\s*(\S+)\s*\(\s*(\d+)\)\s*count:(\d+)\s+ave_time:(\d+)\s+total_time:(\d+)")


def parse_sdiag(text: str) -> tuple[Sdiag, int]:
    """Parse plain ``sdiag`` (22.05 .. 25.x print the same ``Label: value`` lines)."""
    out = Sdiag()
    bad = 0
    section = "top"
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("*"):
            continue
        low = line.lower()
        heading = next((name for start, name in _SDIAG_SECTIONS if low.startswith(start)), None)
        if heading is not None:
            section = heading
            continue
        if section in ("rpc_type", "rpc_user"):
            m = _RPC_RE.match(line)
            if m:
                target = out.rpc_by_type if section == "rpc_type" else out.rpc_by_user
                target[m.group(1)] = (float(m.group(3)), float(m.group(4)), float(m.group(5)))
            continue
        if ":" not in line:
            continue
        label, _, value = line.partition(":")
        table = {"top": _SDIAG_TOP, "main": _SDIAG_MAIN, "backfill": _SDIAG_BACKFILL}.get(
            section, {}
        )
        key = table.get(label.strip())
        if key is None:
            continue
        number = _float(value.split()[0]) if value.split() else None
        if number is None:
            bad += 1
            continue
        out.values[key] = number
    return out, bad
