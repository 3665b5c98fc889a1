"""``sshare -a -P``: fair-share rows."""

from __future__ import annotations

from gpufleet_node.slurm_exporter.model import (
    ShareRow,
)
from gpufleet_node.slurm_exporter.parsers.common import _float, _pipe_records


def parse_sshare(text: str) -> tuple[list[ShareRow], int]:
    """Parse ``sshare -a -P -n -o Account,User,RawShares,NormShares,RawUsage,NormUsage,FairShare``.

    Without slurmdbd (no associations) sshare prints nothing and exits 0.
    """
    rows: list[ShareRow] = []
    bad = 0
    for fields in _pipe_records(text.splitlines(), 7, last_takes_rest=False):
        if fields is None:
            bad += 1
            continue
        account, user = fields[0], fields[1]
        if not account:
            bad += 1
            continue
        rows.append(
            ShareRow(
                account=account,
                user=user,
                raw_shares=_float(fields[2]),  # "parent" -> None
                norm_shares=_float(fields[3]),
                raw_usage=_float(fields[4]),
                norm_usage=_float(fields[5]),
                fairshare=_float(fields[6]),
            )
        )
    return rows, bad
