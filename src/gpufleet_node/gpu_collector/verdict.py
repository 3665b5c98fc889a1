"""The node's GPU health verdict, from what one collector cycle read (no extra tool call).

Each check has a state: ``ok``, ``warn``, ``fail`` or ``unknown``. ``fail`` means the GPU
or node needs a reset, reboot or repair before it runs jobs again; ``unknown`` (the
collector could not read the GPUs) is not healthy, but it is not a fault either: nothing
drains on it. The verdict is written as ``node_gpu_health_check`` series and as a JSON
document that ``gpufleet-gpu-health`` (Slurm's HealthCheckProgram) acts on; see
docs/health.md.

XIDs count against a baseline: the critical XIDs seen since the node booted or since an
admin cleared them (``gpufleet-gpu-health clear``, after a GPU reset or repair). The
collector's counters themselves never go back.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NamedTuple

from .model import Sample
from .xidcatalog import CATALOG, CRITICAL_XIDS, WARNING_XIDS

STATES = ("ok", "warn", "fail", "unknown")
VERDICT_VERSION = 1
# Page retirement (before Ampere) has room for 64 retired pages per GPU (NVIDIA, "Row
# Remapping"): past that, a new double-bit error can no longer be mapped out.
RETIRED_PAGES_LIMIT = 64
RECOVERY_ACTIONS = {1: "GPU reset", 2: "node reboot", 3: "drain P2P", 4: "drain and reset"}
# Checks per GPU, in the order a person reads them; "node" checks have gpu "".
GPU_CHECKS = (
    "xid",
    "ecc_uncorrectable",
    "row_remap_failure",
    "row_remap_pending",
    "retired_pages",
    "recovery_action",
)
NODE_CHECKS = ("collector", "gpu_count")
REASON_MAX_CHARS = 120


class Check(NamedTuple):
    check: str
    gpu: str  # "" for a check of the whole node
    state: str  # one of STATES
    reason: str  # "" when ok


def _by_gpu(samples: Sequence[Sample], name: str) -> dict[str, list[Sample]]:
    out: dict[str, list[Sample]] = {}
    for sample in samples:
        if sample.name == name:
            out.setdefault(dict(sample.labels).get("gpu", ""), []).append(sample)
    return out


def _value(found: list[Sample], **labels: str) -> float | None:
    for sample in found:
        have = dict(sample.labels)
        if all(have.get(key) == want for key, want in labels.items()):
            return sample.value
    return None


def gpu_state_checks(samples: Sequence[Sample], gpu: str) -> list[Check]:
    """The checks of one GPU read from nvidia-smi's answer (absent field: ok)."""

    def one(name: str) -> list[Sample]:
        return _by_gpu(samples, name).get(gpu, [])

    checks = []
    ecc = _value(one("ecc_uncorrected_errors_total"), scope="volatile") or 0.0
    checks.append(
        Check("ecc_uncorrectable", gpu, "fail", f"{ecc:.0f} uncorrectable ECC errors")
        if ecc > 0
        else Check("ecc_uncorrectable", gpu, "ok", "")
    )
    failure = (_value(one("remapped_rows_failure")) or 0.0) > 0
    checks.append(
        Check("row_remap_failure", gpu, "fail", "row remap failed, replace the GPU")
        if failure
        else Check("row_remap_failure", gpu, "ok", "")
    )
    pending = (_value(one("remapped_rows_pending")) or 0.0) > 0
    checks.append(
        Check("row_remap_pending", gpu, "fail", "row remap pending, reset the GPU")
        if pending
        else Check("row_remap_pending", gpu, "ok", "")
    )
    retired = sum(s.value for s in one("retired_pages"))
    if retired >= RETIRED_PAGES_LIMIT:
        checks.append(
            Check("retired_pages", gpu, "fail", f"{retired:.0f} retired pages, the limit")
        )
    elif (_value(one("retired_pages_pending")) or 0.0) > 0:
        checks.append(Check("retired_pages", gpu, "warn", "page retirement pending, reboot"))
    else:
        checks.append(Check("retired_pages", gpu, "ok", ""))
    action = int(_value(one("recovery_action")) or 0)
    checks.append(
        Check("recovery_action", gpu, "fail", f"driver asks for {RECOVERY_ACTIONS[action]}")
        if action in RECOVERY_ACTIONS
        else Check("recovery_action", gpu, "ok", "")
    )
    return checks


def _has_xid(gpu: str, new: dict[str, int], pci_map: dict[str, list[str]]) -> bool:
    return any((pci_map.get(key.partition("|")[0]) or [""])[0] == gpu for key in new)


def new_xids(counts: dict[str, int], baseline: dict[str, int]) -> dict[str, int]:
    """'pci|xid' -> XIDs counted since the baseline (a counter below its baseline, as
    after the collector's state was lost, counts from zero)."""
    out = {}
    for key, count in counts.items():
        seen = baseline.get(key, 0)
        added = count - seen if count >= seen else count
        if added > 0:
            out[key] = added
    return out


def xid_checks(
    gpus: Sequence[str], new: dict[str, int], pci_map: dict[str, list[str]]
) -> list[Check]:
    """One xid check per GPU: the worst tier of its XIDs since the baseline. A GPU the
    collector saw before keeps its index when it is gone now (XID 79: fallen off the
    bus); XIDs of an address no GPU ever had go to the node's check."""
    known = {ids[0] for ids in pci_map.values() if ids and ids[0].isdigit()}
    gpus = sorted(set(gpus) | {g for g in known if _has_xid(g, new, pci_map)}, key=_num)
    worst: dict[str, tuple[int, int]] = {}  # gpu -> (rank, xid)
    for key in sorted(new):
        pci, _, code = key.partition("|")
        xid = int(code)
        rank = 2 if xid in CRITICAL_XIDS else 1 if xid in WARNING_XIDS else 0
        if not rank:
            continue
        gpu = (pci_map.get(pci) or [""])[0]
        gpu = gpu if gpu in gpus else ""
        if rank > worst.get(gpu, (0, 0))[0]:
            worst[gpu] = (rank, xid)
    checks = []
    for gpu in [*gpus, *([""] if "" in worst else [])]:
        rank, xid = worst.get(gpu, (0, 0))
        if not rank:
            checks.append(Check("xid", gpu, "ok", ""))
            continue
        state = "fail" if rank == 2 else "warn"
        checks.append(Check("xid", gpu, state, f"xid{xid} ({CATALOG[xid].meaning})"))
    return checks


def node_checks(
    collector_error: str | None, found: int | None, expected: int | None
) -> list[Check]:
    if collector_error is not None:
        collector = Check("collector", "", "unknown", f"collector failed: {collector_error}")
    else:
        collector = Check("collector", "", "ok", "")
    if found is None or not expected:
        count = Check("gpu_count", "", "unknown" if expected and found is None else "ok", "")
    elif found < expected:
        count = Check("gpu_count", "", "fail", f"{found} of {expected} GPUs present")
    else:
        count = Check("gpu_count", "", "ok", "")
    return [collector, count]


def verdict_checks(
    samples: Sequence[Sample],
    collector_error: str | None,
    expected: int | None,
    xid_counts: dict[str, int] | None = None,
    xid_baseline: dict[str, int] | None = None,
    pci_map: dict[str, list[str]] | None = None,
) -> list[Check]:
    """Every check of the node for one cycle. Without a GPU reading (a failed cycle) the
    GPU checks are unknown, except XIDs, which come from the kernel log."""
    gpus = sorted({dict(s.labels).get("gpu", "") for s in samples if s.name == "info"}, key=_num)
    found = None if collector_error is not None else len(gpus)
    checks = node_checks(collector_error, found, expected)
    if xid_counts is not None:
        new = new_xids(xid_counts, xid_baseline or {})
        checks += xid_checks(gpus, new, pci_map or {})
    for gpu in gpus:
        checks += gpu_state_checks(samples, gpu)
    return checks


def _num(gpu: str) -> tuple[int, str]:
    return (int(gpu), "") if gpu.isdigit() else (1 << 30, gpu)


def worst_state(checks: Sequence[Check]) -> str:
    return worst({check.state for check in checks})


def worst(states: set[str]) -> str:
    """fail > unknown > warn > ok: an unreadable node is never reported healthy."""
    for state in ("fail", "unknown", "warn"):
        if state in states:
            return state
    return "ok"


def verdict_samples(checks: Sequence[Check]) -> list[Sample]:
    samples = [
        Sample(
            "health_check",
            (("gpu", c.gpu), ("check", c.check), ("state", c.state), ("reason", c.reason)),
            1.0,
        )
        for c in checks
        if c.state != "ok"  # a healthy GPU costs no series; the verdict says "ok"
    ]
    worst = worst_state(checks)
    samples += [
        Sample("health_verdict", (("state", s),), 1.0 if s == worst else 0.0) for s in STATES
    ]
    return samples


def verdict_document(
    checks: Sequence[Check], now: float, boot_id: str, jobs: dict[str, list[str]]
) -> str:
    """The JSON the health program reads: every check, and the jobs on each GPU."""
    body: dict[str, Any] = {
        "version": VERDICT_VERSION,
        "time": round(now, 3),
        "boot_id": boot_id,
        "verdict": worst_state(checks),
        "checks": [
            {
                "check": c.check,
                "gpu": c.gpu,
                "state": c.state,
                "reason": c.reason[:REASON_MAX_CHARS],
                "jobs": jobs.get(c.gpu, []) if c.state != "ok" else [],
            }
            for c in checks
        ],
    }
    return json.dumps(body, sort_keys=True)


def jobs_by_gpu_index(samples: Sequence[Sample]) -> dict[str, list[str]]:
    """GPU index -> Slurm job ids with a process on it this cycle (slurm_job_info)."""
    out: dict[str, set[str]] = {}
    for sample in samples:
        if sample.name == "slurm_job_info":
            labels = dict(sample.labels)
            out.setdefault(labels.get("gpu", ""), set()).add(labels.get("job_id", ""))
    return {gpu: sorted(ids - {""}) for gpu, ids in out.items()}
