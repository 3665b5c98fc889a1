"""NVIDIA's XID catalog: what each code means, what NVIDIA says to do, and its tier here.

Meanings and actions follow NVIDIA's XID catalog for Ampere and later (the "Immediate"
resolution of docs.nvidia.com/deploy/xid-errors, analyzing-xid-catalog), summarised in
docs/health.md. The tier is gpufleet's:

- ``critical``: the GPU or node needs a reset, reboot or repair before it runs jobs again;
  the health verdict fails and, in a drain mode, the node leaves Slurm.
- ``warning``: worth a look (row remap recorded, SBE storm, contained error); warns only.
- every code not listed: an application's own fault (13, 31, 43, ...): no health impact.
"""

from __future__ import annotations

from typing import NamedTuple


class Xid(NamedTuple):
    meaning: str
    action: str  # NVIDIA's immediate resolution: reset_gpu, reboot, restart_app, ...
    tier: str  # critical or warning


_NVLINK5 = Xid("NVLink5 unit error", "reset_gpu", "critical")

CATALOG: dict[int, Xid] = {
    45: Xid("preemptive cleanup after earlier errors", "follow_other_xid", "warning"),
    46: Xid("GPU stopped processing", "reset_gpu", "critical"),
    48: Xid("double bit ECC error", "reset_gpu", "critical"),
    62: Xid("internal micro-controller halt", "reset_gpu", "critical"),
    63: Xid("row remap or page retirement recorded", "reset_gpu_when_idle", "warning"),
    64: Xid("row remap or page retirement failure", "reset_gpu", "critical"),
    74: Xid("NVLink error", "reset_gpu", "critical"),
    79: Xid("fallen off the bus", "reboot", "critical"),
    92: Xid("high single-bit ECC error rate", "report", "warning"),
    94: Xid("contained memory error", "restart_app", "warning"),
    95: Xid("uncontained memory error", "reset_gpu", "critical"),
    109: Xid("context switch timeout", "reset_gpu", "critical"),
    110: Xid("security fault", "reset_gpu", "critical"),
    119: Xid("GSP RPC timeout", "reset_gpu", "critical"),
    120: Xid("GSP error", "reset_gpu", "critical"),
    121: Xid("C2C error", "report", "warning"),
    136: Xid("link training failed", "reset_gpu", "critical"),
    140: Xid("unrecovered ECC error", "reset_gpu", "critical"),
    143: Xid("GPU initialization error", "reset_gpu", "critical"),
    **{code: _NVLINK5 for code in range(144, 151)},
    154: Xid("recovery action changed", "read_recovery_action", "critical"),
    155: Xid("NVLink software-defined error", "reset_gpu", "critical"),
    158: Xid("GPU fatal timeout", "reset_gpu", "critical"),
}

CRITICAL_XIDS = frozenset(code for code, xid in CATALOG.items() if xid.tier == "critical")
WARNING_XIDS = frozenset(code for code, xid in CATALOG.items() if xid.tier == "warning")
