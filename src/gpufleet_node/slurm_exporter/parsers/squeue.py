"""``squeue -o ...``: one row per job."""

from __future__ import annotations

from gpufleet_node.slurm_exporter.model import (
    MISSING,
    QueueRow,
)
from gpufleet_node.slurm_exporter.parsers.common import _int, _pipe_records


def parse_squeue(text: str) -> tuple[list[QueueRow], int]:
    """Parse ``squeue -h -a -r --states=all -o '%A|%i|%T|%P|%u|%a|%C|%D|%r'``.

    Lines are split on ``\n`` only (squeue's separator), not on the other characters
    ``str.splitlines`` knows, which a user's account string may contain.
    """
    rows: list[QueueRow] = []
    bad = 0
    for fields in _pipe_records(text.split("\n"), 9):
        if fields is None:
            bad += 1
            continue
        job_id, display, state, parts, user, account, cpus, nodes, reason = fields
        if not job_id or not state or not cpus.isdigit():
            bad += 1
            continue
        rows.append(
            QueueRow(
                job_id=job_id,
                job_id_display=display,
                state=state.upper(),
                partitions=tuple(p for p in parts.split(",") if p) or ("",),
                user=user,
                account="" if account in MISSING else account,
                cpus=int(cpus),
                nodes=_int(nodes),
                reason=reason,
            )
        )
    return rows, bad
